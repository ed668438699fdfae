"""The effects of a run as a table: one row per key, its newest intent and outcome.

``afk-local effects``, ``afk-local show`` and the local web page (``afk-local ui``)
show the same rows, effects left in doubt by a crash first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from afk_local.storage.format.values import plain as to_jsonable

if TYPE_CHECKING:
    from afk_local.storage.rundir.read.reader import RunReader


def effect_rows(reader: RunReader) -> list[dict[str, Any]]:
    """One row per effect key: its newest intent and outcome; in doubt first, then first-seen."""
    if not reader.paths.journal.exists():
        return []
    by_key: dict[str, dict[str, Any]] = {}
    for record in reader.effects():
        row = by_key.setdefault(
            record.key,
            {
                "key": record.key,
                "name": "",
                "step": 0,
                "state": "in_doubt",
                "attempts": 0,
                "intent_ms": None,
                "outcome_ms": None,
                "idempotency_key": "",
                "input_hash": "",
                "result": None,
                "error": None,
            },
        )
        if record.kind == "intent":
            row.update(
                name=record.name,
                step=record.step,
                state="in_doubt",
                intent_ms=record.timestamp_ms,
                outcome_ms=None,
                idempotency_key=record.idempotency_key,
                input_hash=record.input_hash,
                result=None,
                error=None,
            )
            row["attempts"] += 1
        else:
            row.update(
                state=record.status or "ok",
                outcome_ms=record.timestamp_ms,
                result=to_jsonable(record.result),
                error=to_jsonable(record.error) if record.error else None,
            )
    rows = list(by_key.values())
    return [r for r in rows if r["state"] == "in_doubt"] + [
        r for r in rows if r["state"] != "in_doubt"
    ]


__all__ = ["effect_rows"]
