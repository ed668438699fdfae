"""Maintenance of a store's runs: gc, pack, delete and fork, each under the run's lock.

gc and pack visit idle runs in one loop (:func:`on_idle_run`): the run directory is
checked (never a symlink out of the store), its lock taken without waiting (a run
whose owner is alive is skipped untouched), a keyed run compared with its head
record (one put back from an older copy is not touched), and every problem reported
per run, never raised. :class:`~afk_local.Store` holds the public methods; this module
does the work, on anything shaped like a store (:class:`MaintainedStore`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from afk_local.errors import (
    AfkLocalError,
    CheckpointCorruptionError,
    RunLockedError,
    RunNotFoundError,
    UntrustedStoreError,
    run_failure,
)
from afk_local.storage import fsio
from afk_local.storage.format.codec import RecordCodec
from afk_local.storage.format.layout import RunPaths, validate_run_id
from afk_local.storage.format.layout import new_run_id as fresh_run_id
from afk_local.storage.format.records import RunMeta, now_ms
from afk_local.storage.meta_index import note_deletion
from afk_local.storage.rundir.ownership import acquire_lock, lock_is_held
from afk_local.storage.rundir.read.heads import HeadStore
from afk_local.storage.rundir.read.reader import RunReader, read_meta
from afk_local.storage.rundir.run_changes import tell_gone

# Like the Store, the operations and their reports are imported where they are used.
if TYPE_CHECKING:
    from afk_local.storage.ops.retention import GcReport, RetentionPolicy
    from afk_local.storage.rundir.packing import PackReport
    from afk_local.storage.views.run_info import RunInfo, RunList


log = logging.getLogger("afk_local")


class MaintainedStore(Protocol):
    """What maintenance needs of a store (:class:`afk_local.Store` is one)."""

    root: Path
    codec: RecordCodec
    heads: HeadStore | None
    env: fsio.Env

    @property
    def runs_dir(self) -> Path:
        """``<root>/runs``."""
        ...

    def require_writable(self) -> None:
        """Raise StoreReadOnlyError when the store cannot be written."""

    def paths(self, run_id: str, *, refuse_links: bool = False) -> RunPaths:
        """The paths of a run; with ``refuse_links``, never through a symlink."""
        ...

    def open(self, run_id: str, *, lazy: bool = False) -> RunReader:
        """A read-only view of a run."""
        ...

    def run_ids(self) -> list[str]:
        """Ids of every run directory, sorted."""
        ...

    def runs(self) -> RunList:
        """The readable runs, newest created first."""
        ...

    def info(self, run_id: str) -> RunInfo:
        """The :class:`RunInfo` of one run."""
        ...

    def read_meta(self, run_id: str) -> RunMeta:
        """The ``run.meta`` of a run."""
        ...

    def prepare_write(self, run_id: str = "") -> None:
        """Check that this process may write into the store."""
        ...


def on_idle_run(
    store: MaintainedStore,
    run_id: str,
    work: Callable[[RunReader], None],
    *,
    locked: Callable[[], None],
    failed: Callable[[str], None],
    verb: str,
    lock: bool = True,
) -> None:
    """Call ``work`` with a reader of run ``run_id`` under the run's lock, if it is idle.

    The one lock / head-check / report loop of gc and pack: a run whose owner is alive
    is only told to ``locked``; a symlinked run directory, a lock that cannot be taken,
    a keyed run behind its head record and any error of ``work`` are told to ``failed``
    (as ``"<verb>: <error>"``), never raised. ``lock=False`` (a dry run, which only
    plans and writes nothing: it works on a read-only store) reads without the lock.
    """
    try:
        paths = store.paths(run_id, refuse_links=True)
    except UntrustedStoreError as exc:
        failed(f"{verb}: {exc}")
        return
    if lock_is_held(paths.lock):
        locked()
        return
    held = None
    if lock:
        try:
            held = acquire_lock(paths, 0.0)
        except RunLockedError:
            locked()
            return
        except (AfkLocalError, OSError) as exc:
            failed(f"cannot lock {paths.lock}: {exc}")
            return
    try:
        reader = store.open(run_id)
        if store.heads is not None:  # a run put back from an older copy: not touched
            store.heads.require_not_behind(paths, lambda: reader.meta.updated_ms)
        work(reader)
    except Exception as exc:  # one bad run is one reported line; the loop goes on
        if not isinstance(exc, (AfkLocalError, OSError)):
            log.debug("run %s: %s failed", run_id, verb, exc_info=True)
        failed(f"{verb}: {run_failure(exc)}")
    finally:
        if held is not None:
            held.release()


def gc(store: MaintainedStore, policy: RetentionPolicy | None, *, dry_run: bool) -> GcReport:
    """Compact every idle run, then delete old final runs per ``policy`` (see
    :meth:`afk_local.Store.gc`)."""
    from afk_local.storage.ops.retention import (  # noqa: PLC0415
        GcReport,
        RetentionPolicy,
        compact_run,
        remove_stale_builds,
        runs_to_delete,
    )

    policy = policy or RetentionPolicy()
    report = GcReport(dry_run=dry_run)
    if not dry_run:
        store.require_writable()  # a read-only store: one line, not an error per run
        report.removed_temp_dirs = remove_stale_builds(store.runs_dir)
    for run_id in store.run_ids():

        def compact(reader: RunReader, policy: RetentionPolicy = policy) -> None:
            reader.checkpoint_files()  # opens every pack: a damaged one is named, not guessed
            for name, reason in reader.catalog.damaged_packs().items():
                # Never plan a rewrite around checkpoints that cannot be read.
                path = str(reader.paths.dir / name)
                raise CheckpointCorruptionError(path, reason, reader.run_id)
            if store.heads is not None and not dry_run:
                store.heads.loosen(reader.run_id, reader.meta.updated_ms)
            report.compacted.append(compact_run(reader, policy, dry_run=dry_run))
            if store.heads is not None and not dry_run:
                reader.refresh()  # compaction may have rewritten the meta and the journal
                store.heads.anchor(reader.paths, reader.meta.updated_ms)

        def locked(run_id: str = run_id) -> None:
            report.skipped_locked.append(run_id)

        def failed(message: str, run_id: str = run_id) -> None:
            report.errors.append(f"run {run_id}: {message}")

        on_idle_run(
            store, run_id, compact, locked=locked, failed=failed, verb="skipped", lock=not dry_run
        )
    # A run whose newest checkpoint cannot be read is never deleted by a policy: a person
    # looks at it first (`afk-local verify RUN`).
    infos: list[RunInfo] = [i for i in store.runs() if i.damage is None]
    if dry_run:  # account for what compaction would have freed
        freed = {c.run_id: c.bytes_freed for c in report.compacted}
        infos = [replace(i, bytes=max(0, i.bytes - freed.get(i.run_id, 0))) for i in infos]
    for run_id in runs_to_delete(infos, policy, now_ms=now_ms()):
        if dry_run:
            report.deleted_runs.append(run_id)
            continue
        try:
            if delete(store, run_id, only_final=True)[0]:
                report.deleted_runs.append(run_id)
        except RunLockedError:
            report.skipped_locked.append(run_id)
        except Exception as exc:  # reported for that run; the others are still deleted
            report.errors.append(f"run {run_id}: not deleted: {run_failure(exc)}")
    return report


def pack(
    store: MaintainedStore,
    run_ids: list[str] | None,
    *,
    full: bool,
    keep_loose: int,
    dry_run: bool,
    merge: bool = True,
) -> list[PackReport]:
    """Fold the loose checkpoint files of idle runs into packs (:meth:`afk_local.Store.pack`)."""
    from afk_local.storage.rundir.packing import PackReport, pack_run  # noqa: PLC0415

    reports = []
    for run_id in run_ids if run_ids is not None else store.run_ids():
        report = PackReport(run_id)
        if not store.paths(run_id).meta.is_file():
            report.errors.append(f"run {run_id!r} not found under {store.root}")
            reports.append(report)
            continue
        done = [report]  # the packer's own report replaces it once the run is packed

        def pack_one(reader: RunReader, done: list[PackReport] = done) -> None:
            done[0] = pack_run(
                reader.paths,
                store.codec,
                full=full,
                merge=merge,
                keep_loose=keep_loose,
                dry_run=dry_run,
                env=store.env,
            )

        def skip(report: PackReport = report) -> None:
            report.skipped = "its owner is alive (a writer packs as it writes)"

        on_idle_run(
            store, run_id, pack_one, locked=skip, failed=report.errors.append, verb="not packed"
        )
        reports.append(done[0])
    return reports


def delete(
    store: MaintainedStore,
    run_id: str,
    *,
    only_final: bool,
    keep_effects: bool = False,
    check: Callable[[RunMeta], None] | None = None,
) -> tuple[bool, Path | None]:
    """Delete a run under its lock; with ``only_final``, only if it is still final then.

    Returns whether it was deleted (False when ``only_final`` spared it: a resume
    reopened it since gc listed it) and where its journal was kept.

    Raises:
        RunNotFoundError: no such run.
        RunLockedError: its owner is alive.
    """
    from afk_local.storage.ops.removal import keep_journal  # noqa: PLC0415

    paths = store.paths(run_id, refuse_links=True)
    if not paths.dir.is_dir():
        raise RunNotFoundError(run_id, str(store.root))
    lock = acquire_lock(paths, 0.0)
    kept = None
    try:
        meta = read_meta(paths, store.codec) if only_final or check else None
        if only_final and meta is not None and not meta.status.is_final:
            return False, None
        if check is not None and meta is not None:
            check(meta)
        if keep_effects:
            kept = keep_journal(paths, store.root, store.env)
        # Rename first: the run vanishes from listings at once, and a crash
        # mid-delete leaves only a temp directory that gc removes.
        trash = fsio.temp_path(store.runs_dir, f"deleted-{run_id}")
        store.env.rename(paths.dir, trash)
        store.env.fsync_dir(store.runs_dir)
        note_deletion(store.root, store.env)  # the listings' index checks every run again
        tell_gone(store.root, run_id, store.codec.signer, store.env)
    finally:
        lock.release()
    import shutil  # noqa: PLC0415 - shutil (bz2, lzma, fnmatch) only to remove a tree

    shutil.rmtree(trash, ignore_errors=True)
    if store.heads is not None:
        store.heads.remove(run_id)  # deleted on purpose: not a rollback
    return True, kept


def fork(
    store: MaintainedStore,
    run_id: str,
    at_seq: int | None,
    new_run_id: str | None = None,
    *,
    updates: dict[str, Any] | None = None,
    salvage: bool = False,
) -> RunInfo:
    """A new run whose history is ``run_id``'s up to ``at_seq`` (:meth:`afk_local.Store.fork`)."""
    from afk_local.storage.format.journal_format import salvage_journal  # noqa: PLC0415
    from afk_local.storage.ops.fork import fork_run, salvage_point  # noqa: PLC0415

    target_id = validate_run_id(new_run_id) if new_run_id is not None else fresh_run_id()
    store.prepare_write(target_id)
    target = store.paths(target_id, refuse_links=True)
    source = store.open(run_id)
    saved = None
    if salvage:
        saved = salvage_journal(source.paths.journal, run_id, store.codec)
        if at_seq is None:
            at_seq = salvage_point(source, len(saved.kept))
    if at_seq is None:
        raise ValueError("fork needs at_seq (only a salvage picks its own)")
    fork_run(source, at_seq, target, updates=updates, salvage=saved)
    if store.heads is not None:
        store.heads.anchor(target, store.read_meta(target_id).updated_ms)
    return store.info(target_id)


__all__ = ["MaintainedStore", "delete", "fork", "gc", "on_idle_run", "pack"]
