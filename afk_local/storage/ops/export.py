"""Portable JSON copies of runs: ``afk-local export`` and ``afk-local import``.

An export holds the run's meta, every readable checkpoint and every effect record
as JSON. JSON has no bytes type: bytes become base64 strings and come back as
strings, and custom payload types come back as plain data. An import writes every
checkpoint as a keyframe under its original seq, in a temporary directory renamed
into place, so a crash leaves no half-imported run.

An export carries no signatures (it is plain JSON anyone can edit), so an import
checks every field first and marks the run as imported: nothing it names is
executed until someone trusts it (``afk-local resume RUN --trust``). Importing into
a keyed store signs every record with that store's key so it can be read; the
imported mark is signed with it, so the signature cannot launder the run into one
the watcher would execute.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Protocol, TypeVar

import msgspec

from afk_local.errors import (
    AfkLocalError,
    CheckpointCorruptionError,
    ImportFieldError,
    ImportFormatError,
    RunExistsError,
)
from afk_local.storage import fsio
from afk_local.storage.format import codec, values
from afk_local.storage.format.codec import RecordCodec
from afk_local.storage.format.integrity import (
    HISTORY_UNTIL_KEY,
    LINKS_KEY,
    NO_MAC,
    record_digest,
    with_chain_links,
)
from afk_local.storage.format.journal_format import DEFAULT_MAX_FRAME_BYTES, write_journal_file
from afk_local.storage.format.layout import (
    ENTRYPOINT,
    RunPaths,
    checkpoint_name,
    validate_phase,
    validate_run_id,
)
from afk_local.storage.format.records import (
    IMPORTED_KEY,
    SCHEMA_VERSION,
    Checkpoint,
    Effect,
    RunMeta,
    imported_mark,
)
from afk_local.storage.ops.fork import JOURNAL_TRIMMED_KEY
from afk_local.storage.rundir.read.heads import HeadStore
from afk_local.storage.rundir.read.reader import RunReader
from afk_local.storage.rundir.run_changes import tell_meta

_T = TypeVar("_T")

EXPORT_FORMAT = "afk-local-export"


class ImportTarget(Protocol):
    """What an import needs of the store it writes into (:class:`~afk_local.storage.store.Store`
    has it). Declared here so that an operation never imports the store above it."""

    @property
    def codec(self) -> RecordCodec: ...
    @property
    def max_record_bytes(self) -> int: ...
    @property
    def runs_dir(self) -> Path: ...
    @property
    def heads(self) -> HeadStore | None: ...
    @property
    def env(self) -> fsio.Env: ...
    def prepare_write(self, run_id: str) -> None: ...
    def paths(self, run_id: str, *, refuse_links: bool = False) -> RunPaths: ...


def to_jsonable(value: Any) -> Any:
    """Plain JSON-ready data: records to dicts, bytes to base64, non-str keys to str.

    Typed values become their plain form (a path its text, a dataclass its fields;
    see :func:`afk_local.storage.format.values.plain`).
    """
    return values.plain(value)


EXPORT_ATTEMPTS = 4
"""Reads of a run an export tries while rewrites (gc, pack) keep changing it under it."""


def export_records(reader: RunReader) -> list[dict[str, Any]]:
    """The run as tagged records: one ``meta``, then ``checkpoint``s, then ``effect``s.

    Lock-free, so a live writer may go on, and the records are one consistent view:
    the meta first (a status never newer than the checkpoints that carry it), then the
    checkpoints (their ``journal_records`` never more than the effects read after
    them), then the effects, then the meta again. A checkpoint a gc deleted while it
    was read, or a journal gc trimmed in between (``run.meta`` is marked before the
    journal is replaced), makes the export read the run again.

    Raises:
        AfkLocalError: rewrites changed the run under :data:`EXPORT_ATTEMPTS` reads in a
            row (one line; exporting again is safe).
    """
    for _ in range(EXPORT_ATTEMPTS):
        reader.refresh()
        meta = reader.meta
        try:
            checkpoints = reader.history(skip_moved=False)
        except CheckpointCorruptionError as exc:
            if exc.moved:
                continue  # gc deleted a checkpoint while it was read: read it all again
            raise  # pragma: no cover - history skips damage; only moves raise
        effects = reader.effects() if reader.paths.journal.exists() else []
        reader.refresh()
        if _trimmed(reader.meta) != _trimmed(meta):
            continue  # gc trimmed the journal meanwhile: these effects may be the new ones
        return [
            {"type": "format", "format": EXPORT_FORMAT, "version": 1},
            {"type": "meta", "meta": to_jsonable(meta)},
            *({"type": "checkpoint", "checkpoint": to_jsonable(c)} for c in checkpoints),
            *({"type": "effect", "effect": to_jsonable(e)} for e in effects),
        ]
    raise AfkLocalError(
        f"run {reader.run_id!r}: not exported: a gc or pack rewrote it under each of "
        f"{EXPORT_ATTEMPTS} reads; export it again (nothing was changed)"
    )


def _trimmed(meta: RunMeta) -> object:
    extra = meta.extra if isinstance(meta.extra, dict) else {}
    return extra.get(JOURNAL_TRIMMED_KEY)


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
    except RecursionError:
        raise ImportFormatError(source, "nested too deeply to read") from None
    if not isinstance(doc, dict) or doc.get("format") != EXPORT_FORMAT:
        raise ImportFormatError(source, f"no {EXPORT_FORMAT!r} format marker")
    if not isinstance(doc.get("meta"), dict):
        raise ImportFormatError(source, "no run meta")
    checkpoints, effects = doc.get("checkpoints") or [], doc.get("effects") or []
    if not isinstance(checkpoints, list) or not isinstance(effects, list):
        raise ImportFormatError(source, "checkpoints and effects must be lists")
    return doc["meta"], checkpoints, effects


def _convert(doc: Any, cls: type[_T], source: str, where: str) -> _T:
    try:
        return msgspec.convert(doc, cls, str_keys=True)
    except msgspec.ValidationError as exc:
        raise ImportFieldError(source, where, str(exc)) from None
    except RecursionError:
        raise ImportFieldError(source, where, "nested too deeply") from None


def _validated(
    store: ImportTarget,
    source: str,
    meta_doc: Any,
    checkpoint_docs: list[Any],
    effect_docs: list[Any],
) -> tuple[RunMeta, list[Checkpoint], list[Effect]]:
    """Every record of an export, checked field by field before anything is written."""
    meta = _convert(meta_doc, RunMeta, source, "meta")
    if meta.entrypoint is not None and ENTRYPOINT.fullmatch(meta.entrypoint) is None:
        raise ImportFieldError(source, "meta.entrypoint", f"{meta.entrypoint!r} is not module:name")
    for name in ("attempt", "watcher_attempts", "next_attempt_ms", "created_ms", "updated_ms"):
        if getattr(meta, name) < 0:
            raise ImportFieldError(source, f"meta.{name}", "is negative")
    if meta.schema_version > SCHEMA_VERSION:
        raise ImportFieldError(
            source, "meta.schema_version", f"{meta.schema_version} is newer than this afk_local"
        )
    _encodable(store, meta, source, "meta")
    checkpoints: list[Checkpoint] = []
    seen: set[int] = set()
    for i, doc in enumerate(checkpoint_docs):
        where = f"checkpoint #{i + 1}"
        c = _convert(doc, Checkpoint, source, where)
        where = f"checkpoint #{i + 1} (seq {c.seq})"
        try:
            validate_phase(c.phase)
            checkpoint_name(c.seq, c.phase)  # seq range
        except ValueError as exc:
            raise ImportFieldError(source, where, str(exc)) from None
        if c.seq in seen:
            raise ImportFieldError(source, where, "a second checkpoint with this seq")
        seen.add(c.seq)
        if not 1 <= c.schema_version <= SCHEMA_VERSION:
            raise ImportFieldError(source, where, f"schema_version {c.schema_version}")
        if c.step < 0 or c.timestamp_ms < 0:
            raise ImportFieldError(source, where, "negative step or timestamp")
        _encodable(store, c, source, where)
        checkpoints.append(c)
    effects: list[Effect] = []
    for i, doc in enumerate(effect_docs):
        where = f"effect #{i + 1}"
        e = _convert(doc, Effect, source, where)
        if e.kind not in ("intent", "outcome") or not e.key:
            raise ImportFieldError(source, where, f"kind {e.kind!r} / key {e.key!r}")
        if e.kind == "outcome" and e.status not in ("ok", "error"):
            raise ImportFieldError(source, where, f"outcome status {e.status!r}")
        if len(_encodable(store, e, source, where)) > DEFAULT_MAX_FRAME_BYTES:
            raise ImportFieldError(source, where, f"over {DEFAULT_MAX_FRAME_BYTES} bytes")
        effects.append(e)
    return meta, checkpoints, effects


def _encodable(store: ImportTarget, record: Any, source: str, where: str) -> bytes:
    try:
        raw = store.codec.encode(record)
    except (TypeError, ValueError, msgspec.EncodeError) as exc:
        raise ImportFieldError(source, where, str(exc)) from None
    if len(raw) > store.max_record_bytes:
        raise ImportFieldError(
            source, where, f"{len(raw)} bytes, over max_record_bytes={store.max_record_bytes}"
        )
    return raw


def import_run(
    store: ImportTarget, text: str, *, new_run_id: str | None = None, source: str = "-"
) -> str:
    """Recreate an exported run in ``store``; returns its run id.

    Every field is checked before anything is written. The run is marked as
    imported (``RunMeta.extra["imported"]``): nothing it names is ever executed
    until someone trusts it (``afk-local resume RUN --trust``). In a keyed store its
    records are signed so they can be read, and the mark is signed with them: the
    signature says "imported here", not "written by a trusted process".

    Raises:
        ImportFormatError: ``text`` is not an export, or a field is wrong
            (:class:`ImportFieldError`, naming the record and the field).
        RunExistsError: the run id is taken (pass ``new_run_id``).
    """

    meta_doc, checkpoint_docs, effect_docs = _parse(text, source)
    meta, checkpoints, effects = _validated(store, source, meta_doc, checkpoint_docs, effect_docs)
    run_id = validate_run_id(new_run_id or meta.run_id)
    extra = dict(meta.extra)
    for key in (LINKS_KEY, HISTORY_UNTIL_KEY):
        extra.pop(key, None)  # signature bookkeeping of the exporting store means nothing here
    extra[IMPORTED_KEY] = imported_mark(source)
    meta = msgspec.structs.replace(meta, run_id=run_id, owner=None, extra=extra)
    checkpoints = [msgspec.structs.replace(c, run_id=run_id) for c in checkpoints]
    store.prepare_write(run_id)
    target = store.paths(run_id, refuse_links=True)
    if os.path.lexists(target.dir):
        raise RunExistsError(run_id, str(target.dir))
    env = store.env
    env.make_dirs(store.runs_dir)
    tmp_dir = fsio.temp_path(store.runs_dir, f"import-{run_id}")
    env.make_dir(tmp_dir)
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
            env.write_new_file(tmp.checkpoint(c.seq, c.phase), frame)
        if links:
            meta = msgspec.structs.replace(meta, extra=with_chain_links(meta.extra, links))
        if effects:
            write_journal_file(tmp.journal, effects, store.codec, run_id=run_id, env=env)
        if checkpoints:
            last = max(checkpoints, key=lambda c: c.seq)
            env.atomic_symlink(checkpoint_name(last.seq, last.phase), tmp.latest, sync_dir=False)
        env.atomic_write(tmp.meta, codec.encode_meta(store.codec, meta), sync_dir=False)
        try:
            env.publish_dir(tmp_dir, target.dir)
        except FileExistsError:
            raise RunExistsError(run_id, str(target.dir)) from None
        tell_meta(target, meta, store.codec.signer, env)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    if store.heads is not None:
        store.heads.anchor(target, meta.updated_ms)
    return run_id
