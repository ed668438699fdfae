"""Time travel: fork a run at one of its checkpoints into a new run.

The fork's history is the source's up to ``at_seq``, shared through hard links
(checkpoint and pack files are immutable, so sharing is safe; a compaction that
rewrites a file replaces the name, never the inode's bytes) or copied where the
filesystem refuses links. A pack that reaches past ``at_seq`` is written anew
with the entries the fork shares. Its effect journal holds the source's effect records
up to that checkpoint, so resuming the fork replays those calls and executes
the rest anew.

"Up to that checkpoint" is the journal position the checkpoint recorded
(``Checkpoint.journal_records``: how many records were durable when it was
taken), never a comparison of clocks: records journaled in the same millisecond
or after the wall clock stepped back stay out. The fork's journal is that prefix
of the source's, byte for byte in record order, so the positions its inherited
checkpoints recorded hold in the fork too (a fork of the fork works the same
way). A call in flight when the checkpoint was taken (intent before it, outcome
after) is in doubt in the fork, as it was at that instant. A source whose
journal gc trimmed (``max_effects_per_run``) is refused: the fork would repeat the
effects gc dropped. Checkpoints written before positions were recorded fall
back to timestamps (with a warning).

In a keyed store the shared files keep their signatures (made for the source's
run id): the fork's ``run.meta`` lists up to which seq it holds each ancestor's
checkpoints (``extra["history_until_seq"]``), so a later checkpoint of the source
copied into the fork is still refused. Its journal is re-signed for the fork.

The fork is built in a temporary directory and renamed into place, so a crash
leaves either no fork or a complete one. It starts with status ``created`` and
a free lock: resume it with ``afk.resume(new_id)`` or ``afk-local resume NEW_ID``.

Example:
    >>> import afk_local as afk
    >>> store = afk.Store("/tmp/afk-doc-fork")
    >>> with store.create("fork-doc-src") as run:
    ...     _ = run.checkpoint("runtime_state", {"i": 1}, step=1)
    ...     _ = run.checkpoint("runtime_state", {"i": 2}, step=2)
    >>> info = store.fork("fork-doc-src", 1, "fork-doc-copy")
    >>> store.open("fork-doc-copy").latest().payload
    {'i': 1}
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
from collections.abc import Mapping
from typing import Any

import msgspec

from afk_local.errors import AfkLocalError, CheckpointCorruptionError, RunExistsError
from afk_local.storage import fsio
from afk_local.storage.format import codec
from afk_local.storage.format.integrity import (
    HISTORY_KEY,
    HISTORY_UNTIL_KEY,
    chain_links,
    history_run_ids,
    history_until,
    record_digest,
    with_chain_links,
)
from afk_local.storage.format.journal_format import JournalSalvage, write_journal_file
from afk_local.storage.format.layout import (
    CheckpointFile,
    RunPaths,
    checkpoint_name,
    parse_pack_name,
)
from afk_local.storage.format.pack import MAX_PACK_BYTES, PackEntry, encode_pack
from afk_local.storage.format.records import (
    SCHEMA_VERSION,
    Checkpoint,
    Effect,
    Phase,
    RunMeta,
    RunStatus,
    now_ms,
)
from afk_local.storage.ops.state_edit import apply_updates
from afk_local.storage.rundir.read.metrics import METRICS_KEY, copy_archive
from afk_local.storage.rundir.read.reader import CheckpointNotFoundError, RunReader
from afk_local.storage.rundir.rewrite import publish_manifest
from afk_local.storage.rundir.run_changes import tell_meta

log = logging.getLogger("afk_local")

JOURNAL_TRIMMED_KEY = "journal_trimmed"
"""``RunMeta.extra`` key gc sets before it trims a run's journal: forks of it are refused."""


_SNAPSHOT_ATTEMPTS = 5  # listings a fork tries while a pack or gc moves the source's files
_LINK_REFUSED = (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP)


def fork_run(
    source: RunReader,
    at_seq: int,
    target: RunPaths,
    *,
    updates: Mapping[str, Any] | None = None,
    salvage: JournalSalvage | None = None,
) -> None:
    """Create run ``target`` whose history is ``source``'s up to checkpoint ``at_seq``.

    The fork is built in a temp directory next to ``target.dir`` and published
    by one rename, so a crash leaves either no fork or a whole one
    (:meth:`afk_local.Store.fork` is the public form).

    Args:
        source: the source run (left untouched); the fork shares its codec.
        at_seq: the checkpoint the fork continues from; it must exist.
        target: where the fork goes (its run id and directory).
        updates: ``{"state.total": 5, ...}``: the fork gets one more checkpoint, a
            ``runtime_state`` at ``at_seq + 1``: the newest ``runtime_state`` at or before
            ``at_seq`` with these payload paths set (:mod:`.state_edit`), so resuming the
            fork continues from the edited state (LangGraph's ``update_state``).
        salvage: the source's journal is damaged and this is what can be saved of it
            (:func:`~afk_local.storage.format.journal_format.salvage_journal`): the fork's
            journal is its whole intact prefix, plus, as intents only (in doubt), the
            calls recorded after the damage; ``at_seq`` must have been taken within
            the prefix (:func:`salvage_point` finds the newest such checkpoint).

    Raises:
        RunNotFoundError: no source run.
        CheckpointNotFoundError: the source has no checkpoint ``at_seq``.
        CheckpointCorruptionError: the checkpoint at ``at_seq`` is damaged.
        RunExistsError: ``target`` is taken.
        StateEditError: ``updates`` name a path the state does not have, or there is
            no ``runtime_state`` at or before ``at_seq`` to edit.
    """
    for attempt in range(_SNAPSHOT_ATTEMPTS):
        token = source.catalog.view_token()
        try:
            _fork_once(source, at_seq, target, updates=updates, salvage=salvage)
            return
        except (FileNotFoundError, CheckpointCorruptionError) as exc:
            if isinstance(exc, CheckpointCorruptionError) and source.catalog.view_token() == token:
                raise  # damage, not a race
            failure: Exception = exc
            log.info(
                "fork of run %s: files moved while read (%s), attempt %d",
                source.run_id,
                exc,
                attempt + 1,
            )
            source.catalog.scan()
    raise AfkLocalError(
        f"run {source.run_id!r}: not forked: its files kept moving while they were read (a "
        f"pack or gc of the run ran meanwhile: {failure}); nothing was created, try again"
    )


def _fork_once(
    source: RunReader,
    at_seq: int,
    target: RunPaths,
    *,
    updates: Mapping[str, Any] | None = None,
    salvage: JournalSalvage | None = None,
) -> None:
    """One attempt of :func:`fork_run` against the source's files as listed now."""
    run_id, record_codec = source.run_id, source.record_codec
    meta = source.meta
    files = [f for f in source.checkpoint_files() if f.seq <= at_seq]
    if not files or files[-1].seq != at_seq:
        raise CheckpointNotFoundError(run_id, at_seq)
    at = source.load(files[-1])  # the fork point must be readable (raises naming the file)
    target_id = target.run_id
    if target.dir.exists():
        raise RunExistsError(target_id, str(target.dir))
    effects = _effects_until(source, at) if salvage is None else _salvaged(source, at, salvage)
    edited = _edited_state(source, files, updates) if updates else None

    env = source.env  # the store's I/O seam
    runs_dir = target.dir.parent
    env.make_dirs(runs_dir)
    tmp_dir = fsio.temp_path(runs_dir, f"fork-{target_id}")
    env.make_dir(tmp_dir)
    try:
        tmp = RunPaths(target_id, tmp_dir)
        _share_history(source, files, at_seq, tmp)
        if effects:
            write_journal_file(tmp.journal, effects, record_codec, run_id=target_id, env=env)
        copy_archive(source, tmp, at_seq, env)
        newest = files[-1].name
        if edited is not None:
            newest = _write_edited(source, tmp, at_seq, edited)
        env.atomic_symlink(newest, tmp.latest, sync_dir=False)
        stamp = at.timestamp_ms
        now = max(stamp, now_ms())
        extra: dict[str, Any] = dict(meta.extra) if isinstance(meta.extra, dict) else {}
        extra.update(
            {
                "forked_from": run_id,
                "at_seq": at_seq,
                HISTORY_KEY: [*history_run_ids(meta), run_id],
            }
        )
        if updates:
            extra["updated_paths"] = sorted(updates)
        if salvage is not None:
            extra["salvaged"] = {
                "damage_offset": salvage.damage_offset,
                "reason": salvage.reason,
                "kept_records": len(salvage.kept),
                "lost_records": len(salvage.after),
            }
        if record_codec.signer is not None:
            extra = _signed_history(extra, run_id, at_seq)
        new_meta = RunMeta(
            run_id=target_id,
            thread_id=meta.thread_id,
            status=RunStatus.CREATED,
            created_ms=now,
            updated_ms=now,
            entrypoint=meta.entrypoint,
            params=meta.params,
            parent_run_id=run_id,
            code_fingerprint=meta.code_fingerprint,
            version=meta.version,
            extra=extra,
        )
        env.atomic_write(tmp.meta, codec.encode_meta(record_codec, new_meta), sync_dir=False)
        try:
            env.publish_dir(tmp_dir, target.dir)
        except FileExistsError:
            raise RunExistsError(target_id, str(target.dir)) from None
        tell_meta(target, new_meta, record_codec.signer, env)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    log.info("forked run %s at seq %d into %s", run_id, at_seq, target_id)


def _edited_state(
    source: RunReader, files: list[CheckpointFile], updates: Mapping[str, Any]
) -> Checkpoint:
    """The newest ``runtime_state`` among ``files``, its payload edited (metrics dropped)."""
    base = None
    for f in reversed(files):
        if f.phase == Phase.RUNTIME_STATE.value:
            base = source.load(f)
            break
    payload = apply_updates(base.payload if base is not None else None, updates, source.run_id)
    if isinstance(payload, dict):
        payload.pop(METRICS_KEY, None)  # they belong to the checkpoint that first carried them
    assert base is not None  # apply_updates refused a missing state
    return msgspec.structs.replace(base, payload=payload)


def _write_edited(source: RunReader, tmp: RunPaths, at_seq: int, edited: Checkpoint) -> str:
    """Write ``edited`` as the fork's checkpoint ``at_seq + 1``; returns its file name."""
    record = Checkpoint(
        schema_version=SCHEMA_VERSION,
        run_id=tmp.run_id,
        thread_id=edited.thread_id,
        seq=at_seq + 1,
        step=edited.step,
        phase=Phase.RUNTIME_STATE.value,
        timestamp_ms=now_ms(),
        payload=edited.payload,
    )
    record_codec = source.record_codec
    raw = record_codec.encode(record)
    mac = None
    if record_codec.signer is not None:  # chained on the fork point, under the fork's own id
        at_file = next(f for f in source.checkpoint_files() if f.seq == at_seq)
        prev = source.record_bytes(at_file)[1]
        assert prev is not None  # a keyed reader refused an unsigned fork point already
        mac = record_codec.signer.checkpoint_mac(
            tmp.run_id, record.seq, record.phase, prev, record_digest(raw)
        )
    name = checkpoint_name(record.seq, record.phase)
    frame = codec.pack_frame(codec.KIND_CHECKPOINT, codec.compress(raw), mac=mac)
    source.env.write_new_file(tmp.dir / name, frame)
    return name


def _share_history(
    source: RunReader, files: list[CheckpointFile], at_seq: int, tmp: RunPaths
) -> None:
    """Put the source's checkpoints up to ``at_seq`` into the fork's directory ``tmp``.

    Loose files and packs wholly before ``at_seq`` are hard-linked; a pack reaching
    ``at_seq`` or past it is written anew for the fork with its entries before
    ``at_seq`` (signed for the fork in a keyed store). The fork point itself is always a
    loose file, at the fork's ``loose_from``, so the fork's ``latest`` names a file of its
    own that gc keeps (a linked pack holding it too made gc take it for a leftover).
    """
    record_codec = source.record_codec
    for f in files:
        if f.pack is None:
            _link_or_copy(source.paths.dir / f.name, tmp.dir / f.name, source.env)
    for name in sorted({f.pack for f in files if f.pack is not None}):
        pack = parse_pack_name(name)
        if pack is not None and pack.last < at_seq:  # at_seq itself is the loose fork point
            _link_or_copy(source.paths.dir / name, tmp.dir / name, source.env)
            continue
        reader = source.catalog.pack_reader(name)
        index = reader.index
        entries = [
            PackEntry(seq, index.phase(i), reader.image(i))
            for i, seq in enumerate(index.seqs)
            if seq < at_seq
        ]
        if entries:
            pack_file, data = encode_pack(entries, run_id=tmp.run_id, signer=record_codec.signer)
            source.env.write_new_file(tmp.dir / pack_file, data)
    at = files[-1]
    if at.pack is not None:
        source.env.write_new_file(tmp.dir / at.name, source.stored_bytes(at))
    packs = [p for p in (parse_pack_name(n) for n in os.listdir(tmp.dir)) if p is not None]
    if packs and source.catalog.manifest() is not None:
        # The fork's packs hold seqs below every loose file it has: one manifest says so.
        loose_from = max(p.last for p in packs) + 1
        publish_manifest(
            tmp,
            None,
            [p.name for p in packs],
            loose_from,
            signer=record_codec.signer,
            env=source.env,
        )


def _link_or_copy(src: os.PathLike[str], dst: os.PathLike[str], env: fsio.Env) -> None:
    try:
        env.hard_link(src, dst)
        return
    except OSError as exc:
        if exc.errno not in _LINK_REFUSED:
            raise
    data = fsio.read_bounded(src, max(codec.DEFAULT_MAX_RECORD_BYTES * 2, MAX_PACK_BYTES))
    env.write_new_file(dst, data)


def _effects_until(source: RunReader, at: Checkpoint) -> list[Effect]:
    """Journal records the fork inherits: those durable when checkpoint ``at`` was taken.

    Raises:
        AfkLocalError: the source's journal was trimmed by gc, or holds fewer records
            than the checkpoint says were durable (then it lost some).
    """
    if not source.paths.journal.exists():
        return []
    records: list[Effect] = list(source.effects())
    # run.meta read after the journal: gc marks it trimmed before it replaces the journal,
    # so a trimmed journal read here is always seen with its mark (a meta read before it
    # may predate a gc that trimmed in between).
    source.refresh()
    extra = source.meta.extra if isinstance(source.meta.extra, dict) else {}
    if extra.get(JOURNAL_TRIMMED_KEY):
        raise AfkLocalError(
            f"run {source.run_id!r}: not forked: gc trimmed its effect journal "
            "(max_effects_per_run), so the effects before checkpoint "
            f"{at.seq} are no longer all there and the fork would run them again. Fork runs "
            "before trimming their journals"
        )
    if at.journal_records is None:
        log.warning(
            "run %s: checkpoint %d predates journal positions; the fork's effects are chosen "
            "by their timestamps",
            source.run_id,
            at.seq,
        )
        return _effects_by_time(records, at)
    if at.journal_records > len(records):
        raise AfkLocalError(
            f"run {source.run_id!r}: not forked: checkpoint {at.seq} was taken with "
            f"{at.journal_records} effect records durable, but {source.paths.journal} holds "
            f"{len(records)}: the journal lost records. Run `afk-local verify {source.run_id}`"
        )
    return records[: at.journal_records]


def salvage_point(source: RunReader, kept_records: int) -> int:
    """The newest readable checkpoint taken with at most ``kept_records`` journal records.

    Raises:
        AfkLocalError: no checkpoint of the run qualifies.
    """
    for file in reversed(source.checkpoint_files()):
        try:
            record = source.load(file)
        except CheckpointCorruptionError:
            continue
        if record.journal_records is not None and record.journal_records <= kept_records:
            return file.seq
    raise AfkLocalError(
        f"run {source.run_id!r}: nothing to salvage: no readable checkpoint was taken "
        f"within the intact part of its journal ({kept_records} records); start the job "
        "anew with a new run id"
    )


def _salvaged(source: RunReader, at: Checkpoint, salvage: JournalSalvage) -> list[Effect]:
    """The journal of a salvage fork: the intact prefix, then lost calls as open intents."""
    if at.journal_records is None or at.journal_records > len(salvage.kept):
        raise AfkLocalError(
            f"run {source.run_id!r}: not salvaged: checkpoint {at.seq} was taken after the "
            f"damage in {source.paths.journal} (byte {salvage.damage_offset}); leave out "
            "--at to salvage from the newest checkpoint before it"
        )
    lost_intents = [r for r in salvage.after if r.kind == "intent"]
    return [*salvage.kept, *lost_intents]


def _effects_by_time(records: list[Effect], at: Checkpoint) -> list[Effect]:
    """The old rule, for checkpoints without a journal position: by timestamp, then step.

    Timestamps order records and checkpoints; within the checkpoint's own
    millisecond, an intent's ``step`` decides. An intent whose outcome came after
    the checkpoint is left out with its outcome. Wrong when the clock stepped back
    or a later record shares the millisecond and the step: positions are exact.
    """
    included: dict[str, bool] = {}  # key -> was its newest intent before the checkpoint
    early: list[Effect] = []
    for r in records:
        if r.kind == "intent":
            before = r.timestamp_ms < at.timestamp_ms or (
                r.timestamp_ms == at.timestamp_ms and r.step <= at.step
            )
            included[r.key] = before
        else:
            before = included.get(r.key, r.timestamp_ms <= at.timestamp_ms)
            before = before and r.timestamp_ms <= at.timestamp_ms
        if before:
            early.append(r)
    finished_late = {
        r.key for r in records if r.kind == "outcome" and r.timestamp_ms > at.timestamp_ms
    }
    return [r for r in early if not (r.kind == "intent" and r.key in finished_late)]


def _signed_history(extra: dict[str, Any], source_id: str, at_seq: int) -> dict[str, Any]:
    """A keyed fork's extra: which ancestor owns its checkpoints up to which seq, and the
    chain links (from compactions of the source) that its shared files still need."""
    until = {rid: min(seq, at_seq) for rid, seq in history_until(extra).items()}
    until[source_id] = at_seq
    links = {seq: mac for seq, mac in chain_links(extra).items() if seq <= at_seq}
    return {**with_chain_links(extra, links), HISTORY_UNTIL_KEY: until}
