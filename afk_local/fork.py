"""Time travel: fork a run at one of its checkpoints into a new run.

The fork's history is the source's up to ``at_seq``, shared through hard links
(checkpoint files are immutable, so sharing is safe; a compaction that rewrites
a file replaces the name, never the inode's bytes) or copied where the
filesystem refuses links. Its effect journal holds the source's effect records
up to that checkpoint, so resuming the fork replays those calls and executes
the rest anew.

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
from typing import TYPE_CHECKING, Any

from afk_local import codec, fsio
from afk_local.codec import RecordCodec
from afk_local.errors import RunExistsError
from afk_local.integrity import HISTORY_UNTIL_KEY, chain_links, history_until, with_chain_links
from afk_local.layout import RunPaths, validate_run_id
from afk_local.reader import CheckpointNotFoundError
from afk_local.records import Checkpoint, Effect, RunMeta, RunStatus

if TYPE_CHECKING:
    from afk_local.store import RunInfo, Store

log = logging.getLogger("afk_local")

HISTORY_KEY = "history_run_ids"
"""``RunMeta.extra`` key: ids of the runs whose checkpoint records this run shares."""

_LINK_REFUSED = (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP)


def history_run_ids(meta: RunMeta) -> tuple[str, ...]:
    """Run ids (besides its own) that a run's checkpoint records may carry: its fork ancestors."""
    ids = meta.extra.get(HISTORY_KEY) if isinstance(meta.extra, dict) else None
    if not isinstance(ids, list):
        return ()
    return tuple(i for i in ids if isinstance(i, str))


def fork_run(store: Store, run_id: str, at_seq: int, new_run_id: str | None = None) -> RunInfo:
    """Create a new run whose history is ``run_id``'s up to checkpoint ``at_seq``.

    Args:
        store: the store holding the source; the fork goes into the same store.
        run_id: the source run (left untouched).
        at_seq: the checkpoint the fork continues from; it must exist.
        new_run_id: the fork's id (default: a fresh one).

    Returns:
        The new run's :class:`~afk_local.store.RunInfo`.

    Raises:
        RunNotFoundError: no source run.
        CheckpointNotFoundError: the source has no checkpoint ``at_seq``.
        CheckpointCorruptionError: the checkpoint at ``at_seq`` is damaged.
        RunExistsError: ``new_run_id`` is taken.
    """
    from afk_local.store import new_run_id as fresh_id  # noqa: PLC0415 - store imports us

    source = store.open(run_id)
    meta = source.meta
    files = [f for f in source.checkpoint_files() if f.seq <= at_seq]
    if not files or files[-1].seq != at_seq:
        raise CheckpointNotFoundError(run_id, at_seq)
    at = source.load(files[-1])  # the fork point must be readable (raises naming the file)
    target_id = validate_run_id(new_run_id) if new_run_id is not None else fresh_id()
    target = store.paths(target_id)
    if target.dir.exists():
        raise RunExistsError(target_id, str(target.dir))
    effects = _effects_until(source, at)

    fsio.make_dirs(store.runs_dir)
    tmp_dir = fsio.temp_path(store.runs_dir, f"fork-{target_id}")
    fsio.make_dir(tmp_dir)
    try:
        tmp = RunPaths(target_id, tmp_dir)
        for f in files:
            _link_or_copy(source.paths.dir / f.name, tmp_dir / f.name)
        if effects:
            _write_journal(tmp, effects, store.codec)
        fsio.atomic_symlink(files[-1].name, tmp.latest, sync_dir=False)
        stamp = at.timestamp_ms
        now = max(stamp, _now_ms())
        extra: dict[str, Any] = dict(meta.extra) if isinstance(meta.extra, dict) else {}
        extra.update(
            {
                "forked_from": run_id,
                "at_seq": at_seq,
                HISTORY_KEY: [*history_run_ids(meta), run_id],
            }
        )
        if store.keyed:
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
        fsio.atomic_write(tmp.meta, codec.encode_meta(store.codec, new_meta), sync_dir=False)
        try:
            fsio.publish_dir(tmp_dir, target.dir)
        except FileExistsError:
            raise RunExistsError(target_id, str(target.dir)) from None
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    log.info("forked run %s at seq %d into %s", run_id, at_seq, target_id)
    return store.info(target_id)


def _now_ms() -> int:
    from afk_local.run import now_ms  # noqa: PLC0415

    return now_ms()


def _link_or_copy(src: os.PathLike[str], dst: os.PathLike[str]) -> None:
    try:
        os.link(src, dst, follow_symlinks=False)
        return
    except OSError as exc:
        if exc.errno not in _LINK_REFUSED:
            raise
    data = fsio.read_bounded(src, codec.DEFAULT_MAX_RECORD_BYTES * 2)
    fsio.write_new_file(dst, data)


def _effects_until(source: Any, at: Checkpoint) -> list[Effect]:
    """Journal records written no later than the fork checkpoint ``at``.

    Timestamps order records and checkpoints; within the checkpoint's own
    millisecond, an intent's ``step`` (the runner's step counter, also stored in
    the checkpoint) decides. An intent whose outcome came after the checkpoint is
    left out with its outcome: in the fork that call has not started yet. An
    intent that never got an outcome stays (in doubt in the fork as in the source).
    """
    if not source.paths.journal.exists():
        return []
    records: list[Effect] = list(source.effects())
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


def _write_journal(paths: RunPaths, effects: list[Effect], record_codec: RecordCodec) -> None:
    from afk_local.retention import write_journal_file  # noqa: PLC0415

    write_journal_file(paths.journal, effects, record_codec, run_id=paths.run_id)
