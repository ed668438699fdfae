"""What the ``afk-local`` read commands show: rows and facts as plain data, and tables.

Each function returns JSON-ready data (``--json`` prints it as is); :func:`print_table`
turns rows into an aligned table (with ``rich`` when it is installed and stdout is a
terminal). Only :func:`verify_run` may write: it repairs a torn journal tail when the
run's lock is free.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from afk_local.cli.command import CliError
from afk_local.errors import AfkLocalError, RunLockedError, run_failure
from afk_local.storage.format import codec
from afk_local.storage.format.layout import parse_checkpoint_name
from afk_local.storage.views.run_progress import progress_of

if TYPE_CHECKING:
    from afk_local.storage.rundir.read.reader import RunReader
    from afk_local.storage.store import Store

log = logging.getLogger("afk_local")

_MISSING = object()


# -- tables ---------------------------------------------------------------------------


def print_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    align_right: Sequence[int] = (),
    file: Any = None,
) -> None:
    """Print ``rows`` as an aligned table (rich on a terminal, when installed)."""
    out = file or sys.stdout
    cells = [[str(c) for c in row] for row in rows]
    if out is sys.stdout and sys.stdout.isatty():
        try:
            from rich.console import Console  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415
            from rich.table import Table  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415
        except ImportError:
            pass
        else:
            table = Table(box=None, header_style="bold")
            for index, header in enumerate(headers):
                table.add_column(header, justify="right" if index in align_right else "left")
            for row in cells:
                table.add_row(*row)
            Console().print(table)
            return
    widths = [len(h) for h in headers]
    for row in cells:
        for index, cell in enumerate(row):
            widths[index] = max(widths[index], len(cell))

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(widths[i]) if i in align_right else v.ljust(widths[i])
            for i, v in enumerate(values)
        ]
        return "  ".join(parts).rstrip()

    out.write(line(headers) + "\n")
    for row in cells:
        out.write(line(row) + "\n")


# -- log / effects --------------------------------------------------------------------------


def log_rows(reader: RunReader, *, limit: int | None = None) -> list[dict[str, Any]]:
    """One row per checkpoint file: seq, step, phase, time, size, keyframe or delta, and
    the ``progress`` map a durable job's checkpoint carries (None for others)."""
    files = reader.checkpoint_files()
    if limit is not None:
        files = files[-limit:] if limit else []
    rows = []
    for f in files:
        row: dict[str, Any] = {
            "seq": f.seq,
            "step": None,
            "phase": f.phase,
            "timestamp_ms": None,
            "bytes": 0,
            "frame": "?",
            "base_seq": None,
            "pack": f.pack,
            "error": None,
            "progress": None,
        }
        try:
            data = reader.stored_bytes(f)
            row["bytes"] = len(data)
            header, _ = codec.unpack_frame(
                data, reader.location(f), expect_kind=codec.KIND_CHECKPOINT
            )
            row["frame"] = f"delta<-{header.base_seq}" if header.is_delta else "keyframe"
            if f.pack is not None:
                row["frame"] += " (packed)"
            row["base_seq"] = header.base_seq or None
            record = reader.load(f)
            row["step"], row["timestamp_ms"] = record.step, record.timestamp_ms
            progress = progress_of(record.payload)
            row["progress"] = progress.to_dict() if progress is not None else None
        except (AfkLocalError, OSError) as exc:
            row["error"] = str(getattr(exc, "reason", exc))
        rows.append(row)
    from afk_local.storage.rundir.read.verify import special_checkpoint_names  # noqa: PLC0415

    for path, kind in special_checkpoint_names(reader.paths.dir):  # never opened: named
        parsed = parse_checkpoint_name(os.path.basename(path))
        assert parsed is not None
        rows.append(
            {
                "seq": parsed.seq, "step": None, "phase": parsed.phase, "timestamp_ms": None,
                "bytes": 0, "frame": "?", "base_seq": None, "pack": None,
                "error": f"is a {kind}, not a regular file (ignored)", "progress": None,
            }
        )  # fmt: skip
    rows.sort(key=lambda row: int(row["seq"]))
    if limit is not None:
        rows = rows[-limit:] if limit else []
    return rows


# -- inspect / diff -------------------------------------------------------------------------


def payload_at(payload: Any, path: str | None, *, run_id: str, seq: int) -> Any:
    """The value at dotted ``path`` in ``payload`` (list items by index).

    Raises:
        LookupError: with a message naming the first missing part.
    """
    if not path:
        return payload
    value = payload
    walked = "payload"
    for part in path.split("."):
        nxt: Any = _MISSING
        if isinstance(value, dict):
            nxt = value.get(part, _MISSING)
            if nxt is _MISSING and part.lstrip("-").isdigit():
                nxt = value.get(int(part), _MISSING)
        elif isinstance(value, (list, tuple)) and part.lstrip("-").isdigit():
            index = int(part)
            nxt = value[index] if -len(value) <= index < len(value) else _MISSING
        if nxt is _MISSING:
            if isinstance(value, dict):
                holds = "it has keys: " + ", ".join(sorted(map(str, value))[:10])
            elif isinstance(value, (list, tuple)):
                holds = f"it is a list of {len(value)} items"
            else:
                holds = f"it is a {type(value).__name__}"
            raise CliError(
                f"run {run_id} seq {seq}: no {part!r} in {walked} ({holds}); "
                f"run `afk-local inspect {run_id} {seq}` to see the payload"
            )
        value = nxt
        walked += f".{part}"
    return value


# -- verify -----------------------------------------------------------------------------------


def verify_run(store: Store, run_id: str, *, repair: bool = True) -> dict[str, Any]:
    """Verify one run; with ``repair``, truncate a torn journal tail if the lock is free."""
    # Not store.open(): a damaged (or, in a keyed store, wrongly signed) run.meta must
    # be reported like any other damaged file, not stop the command.
    reader = store.open(run_id, lazy=True)
    try:
        report = reader.verify()
    except Exception as exc:  # one bad run is one reported problem; the others are verified
        log.debug("run %s: verify failed", run_id, exc_info=True)
        return {
            "run_id": run_id,
            "checked_files": 0,
            "problems": [{"path": str(reader.paths.dir), "reason": run_failure(exc)}],
            "notes": [],
            "repaired": [],
        }
    result: dict[str, Any] = {
        "run_id": run_id,
        "checked_files": report.checked_files,
        "problems": [{"path": p.path, "reason": p.reason} for p in report.problems],
        "notes": list(report.notes),
        "repaired": [],
    }
    torn = [n for n in report.notes if n.startswith("effects.log: torn tail")]
    if torn and repair:
        repaired = _repair_journal(store, run_id)
        if repaired:
            result["notes"] = [n for n in result["notes"] if n not in torn]
            result["repaired"].append(repaired)
    torn_meta = [n for n in report.notes if n.startswith("run.meta: torn")]
    if torn_meta and repair:
        repaired = _repair_meta(store, run_id)
        if repaired:
            result["notes"] = [n for n in result["notes"] if n not in torn_meta]
            result["repaired"].append(repaired)
    return result


def _repair_meta(store: Store, run_id: str) -> str | None:
    """Write back a ``run.meta`` a power cut tore, from its terminal checkpoint's copy: any
    writer of the run writes the meta it reads, durably (docs/guarantees.md)."""
    try:
        with store.resume_writer(run_id, lock_timeout=0.0, new_attempt=False) as run:
            path = run.paths.meta
    except (AfkLocalError, OSError):
        return None  # a live owner rewrites it itself; or verify reports what is wrong
    return f"{path}: rewritten from its copy in the terminal checkpoint"


def _repair_journal(store: Store, run_id: str) -> str | None:
    from afk_local.journal.journal import Journal  # noqa: PLC0415
    from afk_local.storage.rundir.ownership import acquire_lock  # noqa: PLC0415

    paths = store.paths(run_id)
    try:
        lock = acquire_lock(paths, 0.0)
    except (RunLockedError, OSError):
        return None  # its owner repairs it when it next opens the journal
    try:
        with Journal(paths.journal, run_id, writable=True, record_codec=store.codec) as journal:
            torn = journal.torn_tail
    except (AfkLocalError, OSError):
        return None
    finally:
        lock.release()
    if torn is None:
        return None
    return (
        f"{paths.journal}: torn tail truncated at byte {torn.offset} "
        f"({torn.dropped_bytes} bytes of a write cut short by a crash: {torn.reason})"
    )


__all__ = [
    "log_rows",
    "payload_at",
    "print_table",
    "verify_run",
]
