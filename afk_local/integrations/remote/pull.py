"""Pulling a run from a remote into a local store, optionally taking its lease.

The run is downloaded into a temporary directory under ``runs/``, checked there as a
reader checks any run (every checkpoint's crc, MAC and delta chain, the journal's
frames and signature chain, run.meta), and only then renamed into place: a pull cut
short, or one that finds a damaged object, leaves nothing half-published.

``take=True`` follows the take protocol (docs/remote.md): the run is first pulled
and checked (a damaged run is refused before anything moves); then the epoch+1 lease
is created (only if nobody else took it meanwhile), THEN the old epoch is listed
again and what it gained meanwhile downloaded and checked, and only then are the
bases taken over recorded in the create-only bases object of the new epoch. Anything
the old owner uploads after that listing lies past the bases and is ignored. A take
of an owner that renews its lease with the background mirror (no ``sync_effects``)
is refused until the lease lapses, unless ``force``.

A copy pulled without ``take`` is read-only: its ``run.meta`` says so
(``extra["remote_copy"]``) and opening it for writing raises LeaseLostError.
"""

from __future__ import annotations

import logging
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import msgspec

from afk_local.errors import (
    RemoteIntegrityError,
    RunExistsError,
    RunNotFoundError,
)
from afk_local.integrations.remote.bucket import Bucket
from afk_local.integrations.remote.identity import store_id
from afk_local.integrations.remote.layout import (
    MAX_META_BYTES,
    MAX_SEGMENT_BYTES,
    max_file_bytes,
)
from afk_local.integrations.remote.lease import (
    Bases,
    last_renewal,
    new_lease,
)
from afk_local.integrations.remote.remote_run import RemoteFile, Snapshot, read_remote_run
from afk_local.integrations.remote.take import (
    OwnerCheck,
    create_take_lease,
    holder_may_live,
    holder_renewal,
    recheck_pins,
    record_bases,
    refuse_live_owner,
    reread_renewal,
    settled_remote,
    wait_for_lapse,
    warn_forced,
)
from afk_local.integrations.remote.upload import durable_journal_end
from afk_local.storage import fsio
from afk_local.storage.format import codec
from afk_local.storage.format.layout import RunPaths, scan_checkpoints, validate_run_id
from afk_local.storage.format.records import RunMeta, now_ms
from afk_local.storage.ops.fork import JOURNAL_TRIMMED_KEY
from afk_local.storage.rundir.mirror import FENCED_NAME, REMOTE_COPY_KEY
from afk_local.storage.rundir.ownership import acquire_lock
from afk_local.storage.rundir.read.reader import RunReader, read_meta
from afk_local.storage.rundir.run_changes import tell_meta
from afk_local.storage.store import Store

log = logging.getLogger("afk_local")


@dataclass
class PullReport:
    """What one pull did."""

    run_id: str
    epoch: int
    """The epoch of the lease the run is under after the pull."""
    took: bool = False
    """True when this pull moved the lease to this store (a new epoch)."""
    files: int = 0
    bytes: int = 0
    journal_bytes: int = 0
    read_only: bool = False
    """True when the local copy is read-only (pulled without ``take`` from another holder)."""
    replaced: bool = False
    """True when a local copy of the run was replaced."""
    up_to_date: bool = False
    """True when the local run was already as new as the remote (nothing downloaded)."""
    remote_age_ms: int | None = None
    """How long before the pull the pulled ``run.meta`` was last written (its ``updated_ms``,
    by the writer's clock): how far behind a live owner the copy may be."""
    seq: int = 0
    """The newest checkpoint seq pulled."""
    in_doubt: list[str] = field(default_factory=list)
    """Effect keys with an intent and no outcome: a resume treats them as in doubt (the
    effect may have run on the other machine) and never runs them on its own."""
    owner_renewed_ms: int | None = None
    """How long ago the previous holder last renewed its lease (None: never, or not asked)."""


def pull_run(
    store: Store,
    url: str | Bucket,
    run_id: str,
    *,
    take: bool = False,
    force: bool = False,
    concurrency: int = 16,
) -> PullReport:
    """Copy run ``run_id`` from ``url`` into ``store``; with ``take``, move its lease here.

    Args:
        force: take even from an owner that still renews its lease with the background
            mirror (docs/remote.md says exactly what may then run twice).

    Raises:
        RunNotFoundError: the remote has no such run.
        RemoteIntegrityError: an object is damaged, or the journal is not continuous
            with the checkpoints; nothing was published.
        LeaseLostError: another store took the run while this one was pulling it.
        MirrorError: (take) the owner still renews its lease and ``force`` is not set.
        RunLockedError: the run is open for writing in this store.
        RunExistsError: a different run (another ``created_ms``) has this id locally.
    """
    validate_run_id(run_id)
    bucket = url if isinstance(url, Bucket) else Bucket(url)
    owner = store_id(store.root)
    signer = store.codec.signer
    renewed = holder_renewal(bucket, run_id, signer) if take else (0, None)
    remote = read_remote_run(bucket, run_id, signer)
    if remote is None:
        raise RunNotFoundError(run_id, bucket.url)
    snapshot = remote.snapshot()
    head = remote.head
    ours = head.owner == owner
    finishing = ours and not head.settled  # this store's earlier take did not finish
    paths = store.paths(run_id)
    fsio.make_dirs(store.runs_dir)
    lock = acquire_lock(paths, 0.0) if paths.dir.is_dir() else None
    try:
        local_seq = _local_seq(paths) if lock is not None else -1
        if (
            ours
            and not finishing
            and local_seq >= snapshot.head_seq
            and durable_journal_end(paths) >= (snapshot.journal_end)
            and not os.path.lexists(paths.dir / FENCED_NAME)
        ):
            return PullReport(run_id, head.epoch, up_to_date=True)
        report = PullReport(run_id, head.epoch)
        taking = take and not ours
        owner_check = OwnerCheck(None)
        if taking:
            owner_check = refuse_live_owner(remote, snapshot, renewed, force)
            report.owner_renewed_ms = owner_check.renewed_ms
        tmp = RunPaths(run_id, fsio.temp_path(store.runs_dir, f"pull-{run_id}"))
        # its own name needs no fsync: _publish fsyncs it and runs/ when it renames it
        fsio.make_dir(tmp.dir, sync_parent=False)
        try:
            fetched: dict[str, int] = {}
            remote_meta = _download(
                bucket, store, snapshot, tmp, report, fetched=fetched, workers=concurrency
            )
            # Every check that can refuse runs BEFORE the lease moves: a refused take
            # publishes nothing, so it neither fences a live owner nor strands an epoch.
            meta = _check(store, tmp, bucket.url, paths if lock is not None else None)
            reread = None
            if taking:  # the lease FIRST, then the old epoch again, then the bases
                reread = reread_renewal(
                    bucket, run_id, head.epoch, renewed[1], owner_check, signer=signer
                )
                lease = new_lease(run_id, head.epoch + 1, owner)
                create_take_lease(bucket, lease, signer)
                report.took, report.epoch, finishing = True, lease.epoch, True
            if finishing:
                pinned = last_renewal(bucket, run_id, head.epoch, signer) if taking else None
                listed = settled_remote(bucket, run_id, signer, owner)
                snapshot = listed.snapshot()
                if taking and holder_may_live(reread, pinned, listed, snapshot, head.epoch):
                    pinned = wait_for_lapse(bucket, run_id, head.epoch, pinned, signer=signer)
                    snapshot = settled_remote(bucket, run_id, signer, owner).snapshot()
                recheck_pins(bucket, pinned, snapshot)
                remote_meta = _download(
                    bucket, store, snapshot, tmp, report, fetched=fetched, workers=concurrency
                )
                meta = _check(store, tmp, bucket.url, paths if lock is not None else None)
            _describe(store, tmp, meta.updated_ms, report)
            if lock is not None and local_seq > snapshot.head_seq:
                log.warning(
                    "run %s: the local copy's checkpoints %d..%d are not on the remote; they "
                    "are dropped (written after the lease moved, or never pushed)",
                    run_id,
                    snapshot.head_seq + 1,
                    local_seq,
                )
            if finishing:
                epoch = report.epoch if report.took else head.epoch
                bases = Bases(
                    run_id=run_id,
                    epoch=epoch,
                    base_seq=snapshot.head_seq,
                    journal_base=snapshot.journal_end,
                    meta=remote_meta,
                )
                record_bases(bucket, bases, signer)
                report.epoch = epoch
                warn_forced(head, owner_check)
            extra = {k: v for k, v in meta.extra.items() if k != REMOTE_COPY_KEY}
            if not ours and not taking:
                extra[REMOTE_COPY_KEY] = {
                    "url": bucket.url,
                    "holder": head.owner,
                    "epoch": head.epoch,
                }
                report.read_only = True
            meta = msgspec.structs.replace(meta, owner=None, extra=extra)
            fsio.atomic_write(tmp.meta, codec.encode_meta(store.codec, meta), sync_dir=False)
            _publish(store, tmp, paths, replace=lock is not None)
            tell_meta(paths, meta, store.codec.signer)
            report.replaced = lock is not None
        except BaseException:
            shutil.rmtree(tmp.dir, ignore_errors=True)
            raise
        return report
    finally:
        if lock is not None:
            lock.release()


def take_run(store: Store, run_id: str, url: str | Bucket, *, force: bool = False) -> PullReport:
    """Pull ``run_id`` from ``url`` and move its lease to ``store`` (``pull --take``).

    What a worker calls before it resumes a run another machine started: afterwards
    ``Store(root, mirror=url)`` may write the run, and the previous owner's next upload
    fails with LeaseLostError. Taking a run this store already holds only refreshes
    the local copy when the remote is newer.

    Example (a fan-out worker continuing a run another machine started)::

        take_run(afk.Store(root), run_id, "s3://bucket/afk")
        afk.resume(run_id, store=afk.Store(root, mirror="s3://bucket/afk"))
    """
    return pull_run(store, url, run_id, take=True, force=force)


def _local_seq(paths: RunPaths) -> int:
    files = scan_checkpoints(paths.dir)
    return files[-1].seq if files else 0


def _describe(store: Store, tmp: RunPaths, updated_ms: int, report: PullReport) -> None:
    """Fill in how old the copy is and which effects a resume will treat as in doubt."""
    report.remote_age_ms = max(0, now_ms() - updated_ms)
    files = scan_checkpoints(tmp.dir)
    report.seq = files[-1].seq if files else 0
    open_intents: dict[str, None] = {}
    reader = RunReader(tmp, record_codec=store.codec, max_record_bytes=store.max_record_bytes)
    for effect in reader.effects():
        if effect.kind == "intent":
            open_intents[effect.key] = None
        else:
            open_intents.pop(effect.key, None)
    report.in_doubt = list(open_intents)


def _check_journal_continuity(store: Store, tmp: RunPaths, url: str) -> None:
    """The newest checkpoint was taken after ``journal_records`` records: the pulled
    journal must hold at least that many, else segments are missing."""
    reader = RunReader(tmp, record_codec=store.codec, max_record_bytes=store.max_record_bytes)
    latest = reader.latest()
    if latest is None or latest.journal_records is None:
        return
    have = len(reader.effects())
    if have < latest.journal_records:
        raise RemoteIntegrityError(
            url,
            f"run {tmp.run_id}: refused, nothing was published: checkpoint {latest.seq} follows "
            f"{latest.journal_records} journal records but the remote journal holds {have} "
            "(segments missing)",
        )


def _download(
    bucket: Bucket,
    store: Store,
    snapshot: Snapshot,
    tmp: RunPaths,
    report: PullReport,
    *,
    fetched: dict[str, int],
    workers: int,
) -> bytes:
    """Write the snapshot's objects into ``tmp``; returns the remote run.meta bytes.

    ``fetched`` (file name -> size) is what an earlier call put in ``tmp``: immutable
    objects are not downloaded twice; files the snapshot no longer holds are removed.
    """

    def fetch(item: RemoteFile) -> int:
        data = bucket.get(item.key, max_file_bytes(item.name, store.max_record_bytes))
        if data is None:
            raise RemoteIntegrityError(bucket.url, f"{item.key} was listed but is gone")
        fsio.write_new_file(tmp.dir / item.name, data)
        return len(data)

    wanted = {item.name for item in snapshot.files}
    for name in [n for n in fetched if n not in wanted]:
        os.unlink(tmp.dir / name)
        del fetched[name]
    todo = [item for item in snapshot.files if item.name not in fetched]
    if workers > 1 and len(todo) > 1:
        with ThreadPoolExecutor(workers, thread_name_prefix="afk-pull") as pool:
            sizes = list(pool.map(fetch, todo))
    else:
        sizes = [fetch(item) for item in todo]
    fetched.update((item.name, size) for item, size in zip(todo, sizes, strict=True))
    report.files, report.bytes = len(fetched), sum(fetched.values())
    for name in (tmp.journal.name, tmp.meta.name, tmp.latest.name):
        if os.path.lexists(tmp.dir / name):
            os.unlink(tmp.dir / name)
    report.journal_bytes = 0
    if snapshot.segments:
        fd = fsio.open_append(tmp.journal)
        try:
            for segment in snapshot.segments:
                data = bucket.get(segment.key, MAX_SEGMENT_BYTES)
                if data is None or len(data) != segment.size:
                    raise RemoteIntegrityError(bucket.url, f"{segment.key} changed while read")
                fsio.write_all(fd, data, tmp.journal)
                report.journal_bytes += len(data)
            fsio.fsync_fd(fd, tmp.journal)
        finally:
            os.close(fd)
    if snapshot.meta_key is not None:
        meta = bucket.get(snapshot.meta_key, MAX_META_BYTES)
        if meta is None:
            raise RemoteIntegrityError(bucket.url, f"{snapshot.meta_key} was listed but is gone")
    elif snapshot.lease_meta is not None:
        meta = snapshot.lease_meta
    else:  # pragma: no cover - snapshot() refuses this
        raise RemoteIntegrityError(bucket.url, f"run {snapshot.run_id}: no run.meta")
    # No fsync: read by the checks only, then always replaced (pull_run's atomic_write of
    # the local meta) before the directory is published.
    fsio.write_new_file(tmp.meta, meta, sync=False)
    files = scan_checkpoints(tmp.dir)
    if files:
        fsio.atomic_symlink(files[-1].name, tmp.latest, sync_dir=False)
    return meta


def _check(store: Store, tmp: RunPaths, url: str, local: RunPaths | None) -> RunMeta:
    """Verify the downloaded run as any reader would, and that it may replace ``local``
    (the same run); returns its meta. Raises before anything is published."""
    _verify(store, tmp, url)
    meta = read_meta(tmp, store.codec)
    if meta.run_id != tmp.run_id:
        raise RemoteIntegrityError(
            url, f"run {tmp.run_id}: its run.meta names run {meta.run_id!r}: refused"
        )
    if not meta.extra.get(JOURNAL_TRIMMED_KEY):
        _check_journal_continuity(store, tmp, url)
    if local is not None and read_meta(local, store.codec).created_ms != meta.created_ms:
        raise RunExistsError(
            tmp.run_id,
            f"{local.dir} (a different run with the same id)",
            next_step="nothing was pulled or taken; pull into another store, or remove "
            f"this store's run first (`afk-local rm {tmp.run_id}`)",
        )
    return meta


def _verify(store: Store, tmp: RunPaths, url: str) -> None:
    """Verify the downloaded run as any reader would; a torn journal tail is damage here."""
    reader = RunReader(tmp, record_codec=store.codec, max_record_bytes=store.max_record_bytes)
    report = reader.verify()
    problems = [f"{os.path.basename(p.path)}: {p.reason}" for p in report.problems]
    if tmp.journal.exists() and durable_journal_end(tmp) != tmp.journal.stat().st_size:
        problems.append("effects.log: its segments end in a torn frame")
    unchecked = [n for n in report.notes if "signatures not checked" in n]
    if unchecked:
        log.warning("run %s pulled from %s: %s", tmp.run_id, url, unchecked[0])
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise RemoteIntegrityError(
            url,
            f"run {tmp.run_id}: refused, nothing was published: {'; '.join(problems[:3])}{more}",
        )


def _publish(store: Store, tmp: RunPaths, target: RunPaths, *, replace: bool) -> None:
    if not replace:
        try:
            fsio.publish_dir(tmp.dir, target.dir)
        except FileExistsError:
            raise RunExistsError(target.run_id, str(target.dir)) from None
        return
    # Under the old copy's lock, one atomic exchange of the two names: a kill or a power
    # cut leaves the old copy or the new one, never the run missing. Where the system
    # cannot swap, two renames: a crash between them leaves the run missing locally (the
    # remote still has it; pull again), never half of it.
    fsio.fsync_dir(tmp.dir)
    trash = fsio.temp_path(store.runs_dir, f"deleted-{target.run_id}")
    if fsio.exchange(tmp.dir, target.dir):
        fsio.fsync_dir(store.runs_dir)
        fsio.rename(tmp.dir, trash)  # the old copy: a trash name gc removes at once
        shutil.rmtree(trash, ignore_errors=True)
        return
    fsio.rename(target.dir, trash)
    fsio.rename(tmp.dir, target.dir)
    fsio.fsync_dir(store.runs_dir)
    shutil.rmtree(trash, ignore_errors=True)


__all__ = ["PullReport", "RemoteIntegrityError", "pull_run", "take_run"]
