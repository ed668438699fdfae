"""Portable JSON copies of runs: ``afk-local export`` and ``afk-local import``.

An export holds the run's meta, every readable checkpoint and every effect record
as JSON. JSON has no bytes type: bytes become base64 strings and come back as
strings, and custom payload types come back as plain data. An import writes every
checkpoint as a keyframe under its original seq, in a temporary directory renamed
into place, so a crash leaves no half-imported run.

An export carries no signatures (it is plain JSON anyone can edit). Importing into
a keyed store signs every record afresh with that store's key: an import is a
trust decision, and the way to sign the runs of a store that had no key before.
"""

from __future__ import annotations

import json
import shutil
from typing import Any

import msgspec

from afk_local.errors import AfkLocalError, RunExistsError
from afk_local.storage import codec, fsio, values
from afk_local.storage.integrity import (
    HISTORY_UNTIL_KEY,
    LINKS_KEY,
    NO_MAC,
    record_digest,
    with_chain_links,
)
from afk_local.storage.journal_format import write_journal_file
from afk_local.storage.layout import RunPaths, checkpoint_name, validate_phase, validate_run_id
from afk_local.storage.reader import RunReader
from afk_local.storage.records import Checkpoint, Effect, RunMeta
from afk_local.storage.store import Store

EXPORT_FORMAT = "afk-local-export"


class ImportFormatError(AfkLocalError, ValueError):
    """An import file is not an afk-local export."""

    def __init__(self, source: str, reason: str) -> None:
        super().__init__(
            f"{source} is not an afk-local export ({reason}); create one with "
            "`afk-local export RUN > FILE`"
        )


def to_jsonable(value: Any) -> Any:
    """Plain JSON-ready data: records to dicts, bytes to base64, non-str keys to str.

    Typed values become their plain form (a path its text, a dataclass its fields;
    see :func:`afk_local.storage.values.plain`).
    """
    return values.plain(value)


def export_records(reader: RunReader) -> list[dict[str, Any]]:
    """The run as tagged records: one ``meta``, then ``checkpoint``s, then ``effect``s."""
    records: list[dict[str, Any]] = [
        {"type": "format", "format": EXPORT_FORMAT, "version": 1},
        {"type": "meta", "meta": to_jsonable(reader.meta)},
    ]
    records += [{"type": "checkpoint", "checkpoint": to_jsonable(c)} for c in reader.history()]
    if reader.paths.journal.exists():
        records += [{"type": "effect", "effect": to_jsonable(e)} for e in reader.effects()]
    return records


def _parse(text: str, source: str) -> tuple[dict[str, Any], list[Any], list[Any]]:
    if not text.strip():
        raise ImportFormatError(source, "the file is empty")
    try:
        try:
            doc = json.loads(text)  # the json format: one document
        except json.JSONDecodeError:
            doc = None  # maybe JSON lines
        if not isinstance(doc, dict) or doc.get("type") == "format":
            lines = [json.loads(line) for line in text.splitlines() if line.strip()]
            doc = {
                "format": next((r.get("format") for r in lines if r.get("type") == "format"), None),
                "meta": next((r.get("meta") for r in lines if r.get("type") == "meta"), None),
                "checkpoints": [r["checkpoint"] for r in lines if r.get("type") == "checkpoint"],
                "effects": [r["effect"] for r in lines if r.get("type") == "effect"],
            }
    except (json.JSONDecodeError, AttributeError, KeyError, TypeError) as exc:
        raise ImportFormatError(source, f"not JSON or JSON lines: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != EXPORT_FORMAT:
        raise ImportFormatError(source, f"no {EXPORT_FORMAT!r} format marker")
    if not isinstance(doc.get("meta"), dict):
        raise ImportFormatError(source, "no run meta")
    return doc["meta"], list(doc.get("checkpoints") or []), list(doc.get("effects") or [])


def import_run(store: Store, text: str, *, new_run_id: str | None = None, source: str = "-") -> str:
    """Recreate an exported run in ``store``; returns its run id.

    Raises:
        ImportFormatError: ``text`` is not an export.
        RunExistsError: the run id is taken (pass ``new_run_id``).
        msgspec.ValidationError: a record has the wrong shape (names the field).
    """

    meta_doc, checkpoint_docs, effect_docs = _parse(text, source)
    meta = msgspec.convert(meta_doc, RunMeta, str_keys=True)
    run_id = validate_run_id(new_run_id or meta.run_id)
    meta = msgspec.structs.replace(meta, run_id=run_id, owner=None)
    if LINKS_KEY in meta.extra or HISTORY_UNTIL_KEY in meta.extra:
        # Signature bookkeeping of the exporting store means nothing here.
        extra = {k: v for k, v in meta.extra.items() if k not in (LINKS_KEY, HISTORY_UNTIL_KEY)}
        meta = msgspec.structs.replace(meta, extra=extra)
    checkpoints = [
        msgspec.structs.replace(msgspec.convert(c, Checkpoint, str_keys=True), run_id=run_id)
        for c in checkpoint_docs
    ]
    for c in checkpoints:
        validate_phase(c.phase)
        checkpoint_name(c.seq, c.phase)  # range check
    effects = [msgspec.convert(e, Effect, str_keys=True) for e in effect_docs]
    target = store.paths(run_id)
    if target.dir.exists():
        raise RunExistsError(run_id, str(target.dir))
    fsio.make_dirs(store.runs_dir)
    tmp_dir = fsio.temp_path(store.runs_dir, f"import-{run_id}")
    fsio.make_dir(tmp_dir)
    try:
        tmp = RunPaths(run_id, tmp_dir)
        signer = store.codec.signer
        prev, prev_seq, links = NO_MAC, 0, {}
        for c in sorted(checkpoints, key=lambda c: c.seq):
            raw = store.codec.encode(c)
            mac = None
            if signer is not None:
                if c.seq > 1 and c.seq - 1 != prev_seq:  # a gap compaction left
                    links[c.seq] = prev
                mac = signer.checkpoint_mac(run_id, c.seq, c.phase, prev, record_digest(raw))
                prev, prev_seq = mac, c.seq
            frame = codec.pack_frame(codec.KIND_CHECKPOINT, codec.compress(raw), mac=mac)
            fsio.write_new_file(tmp.checkpoint(c.seq, c.phase), frame)
        if links:
            meta = msgspec.structs.replace(meta, extra=with_chain_links(meta.extra, links))
        if effects:
            write_journal_file(tmp.journal, effects, store.codec, run_id=run_id)
        if checkpoints:
            last = max(checkpoints, key=lambda c: c.seq)
            fsio.atomic_symlink(checkpoint_name(last.seq, last.phase), tmp.latest, sync_dir=False)
        fsio.atomic_write(tmp.meta, codec.encode_meta(store.codec, meta), sync_dir=False)
        try:
            fsio.publish_dir(tmp_dir, target.dir)
        except FileExistsError:
            raise RunExistsError(run_id, str(target.dir)) from None
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    return run_id
