"""Pulling a run from a remote into a local store, optionally taking its lease.

The run is downloaded into a temporary directory under ``runs/``, checked there as a
reader checks any run (every checkpoint's crc, MAC and delta chain, the journal's
frames and signature chain, run.meta), and only then renamed into place: a pull cut
short, or one that finds a damaged object, leaves nothing half-published. With
``take=True`` the lease moves to this store (a new epoch, created only if nobody
else took it meanwhile) between the check and the publish.

A copy pulled without ``take`` is read-only: its ``run.meta`` says so
(``extra["remote_copy"]``) and opening it for writing raises LeaseLostError.
"""

from __future__ import annotations

import logging
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import msgspec

from afk_local.errors import RemoteIntegrityError, RunExistsError, RunNotFoundError
from afk_local.integrations.remote.bucket import Bucket
from afk_local.integrations.remote.identity import store_id
from afk_local.integrations.remote.layout import (
    MAX_META_BYTES,
    MAX_SEGMENT_BYTES,
    max_file_bytes,
)
from afk_local.integrations.remote.lease import Lease, create_lease, lease_lost, new_lease
from afk_local.integrations.remote.remote_run import RemoteFile, Snapshot, read_remote_run
from afk_local.integrations.remote.upload import durable_journal_end
from afk_local.storage import fsio
from afk_local.storage.format import codec
from afk_local.storage.format.layout import RunPaths, scan_checkpoints, validate_run_id
from afk_local.storage.rundir.mirror import REMOTE_COPY_KEY
from afk_local.storage.rundir.ownership import acquire_lock
from afk_local.storage.rundir.reader import RunReader, read_meta
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


def pull_run(
    store: Store, url: str | Bucket, run_id: str, *, take: bool = False, concurrency: int = 16
) -> PullReport:
    """Copy run ``run_id`` from ``url`` into ``store``; with ``take``, move its lease here.

    Raises:
        RunNotFoundError: the remote has no such run.
        RemoteIntegrityError: an object is damaged; nothing was published.
        LeaseLostError: another store took the run while this one was pulling it.
        RunLockedError: the run is open for writing in this store.
        RunExistsError: a different run (another ``created_ms``) has this id locally.
    """
    validate_run_id(run_id)
    bucket = url if isinstance(url, Bucket) else Bucket(url)
    owner = store_id(store.root)
    remote = read_remote_run(bucket, run_id)
    if remote is None:
        raise RunNotFoundError(run_id, bucket.url)
    snapshot = remote.snapshot()
    head = remote.head
    ours = head.owner == owner
    paths = store.paths(run_id)
    fsio.make_dirs(store.runs_dir)
    lock = acquire_lock(paths, 0.0) if paths.dir.is_dir() else None
    try:
        local_seq = _local_seq(paths) if lock is not None else -1
        if (
            ours
            and local_seq >= snapshot.head_seq
            and durable_journal_end(paths) >= (snapshot.journal_end)
        ):
            return PullReport(run_id, head.epoch, up_to_date=True)
        report = PullReport(run_id, head.epoch)
        tmp = RunPaths(run_id, fsio.temp_path(store.runs_dir, f"pull-{run_id}"))
        fsio.make_dir(tmp.dir)
        try:
            remote_meta = _download(bucket, store, snapshot, tmp, report, workers=concurrency)
            _check(store, tmp, bucket.url)
            meta = read_meta(tmp, store.codec)
            if meta.run_id != run_id:
                raise RemoteIntegrityError(
                    bucket.url, f"run {run_id}: its run.meta names run {meta.run_id!r}: refused"
                )
            if lock is not None:
                _check_same_run(store, paths, meta.created_ms, local_seq, snapshot.head_seq)
            extra = {k: v for k, v in meta.extra.items() if k != REMOTE_COPY_KEY}
            if take and not ours:
                lease = new_lease(
                    run_id,
                    head.epoch + 1,
                    owner,
                    base_seq=snapshot.head_seq,
                    journal_base=snapshot.journal_end,
                    meta=remote_meta,
                )
                _take(bucket, lease)
                report.took, report.epoch = True, lease.epoch
            elif not ours:
                extra[REMOTE_COPY_KEY] = {
                    "url": bucket.url,
                    "holder": head.owner,
                    "epoch": head.epoch,
                }
                report.read_only = True
            meta = msgspec.structs.replace(meta, owner=None, extra=extra)
            fsio.atomic_write(tmp.meta, codec.encode_meta(store.codec, meta), sync_dir=False)
            _publish(store, tmp, paths, replace=lock is not None)
            report.replaced = lock is not None
        except BaseException:
            shutil.rmtree(tmp.dir, ignore_errors=True)
            raise
        return report
    finally:
        if lock is not None:
            lock.release()


def take_run(store: Store, run_id: str, url: str | Bucket) -> PullReport:
    """Pull ``run_id`` from ``url`` and move its lease to ``store`` (``pull --take``).

    What a worker calls before it resumes a run another machine started: afterwards
    ``Store(root, mirror=url)`` may write the run, and the previous owner's next upload
    fails with LeaseLostError. Taking a run this store already holds only refreshes
    the local copy when the remote is newer.

    Example (a fan-out worker continuing a run another machine started)::

        take_run(afk.Store(root), run_id, "s3://bucket/afk")
        afk.resume(run_id, store=afk.Store(root, mirror="s3://bucket/afk"))
    """
    return pull_run(store, url, run_id, take=True)


def _local_seq(paths: RunPaths) -> int:
    files = scan_checkpoints(paths.dir)
    return files[-1].seq if files else 0


def _download(
    bucket: Bucket,
    store: Store,
    snapshot: Snapshot,
    tmp: RunPaths,
    report: PullReport,
    *,
    workers: int,
) -> bytes:
    """Write the snapshot's objects into ``tmp``; returns the remote run.meta bytes."""

    def fetch(item: RemoteFile) -> int:
        data = bucket.get(item.key, max_file_bytes(item.name, store.max_record_bytes))
        if data is None:
            raise RemoteIntegrityError(bucket.url, f"{item.key} was listed but is gone")
        fsio.write_new_file(tmp.dir / item.name, data)
        return len(data)

    if workers > 1 and len(snapshot.files) > 1:
        with ThreadPoolExecutor(workers, thread_name_prefix="afk-pull") as pool:
            sizes = list(pool.map(fetch, snapshot.files))
    else:
        sizes = [fetch(item) for item in snapshot.files]
    report.files, report.bytes = len(sizes), sum(sizes)
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
    fsio.write_new_file(tmp.meta, meta)
    files = scan_checkpoints(tmp.dir)
    if files:
        fsio.atomic_symlink(files[-1].name, tmp.latest, sync_dir=False)
    return meta


def _check(store: Store, tmp: RunPaths, url: str) -> None:
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


def _check_same_run(
    store: Store, paths: RunPaths, created_ms: int, local_seq: int, remote_seq: int
) -> None:
    local = read_meta(paths, store.codec)
    if local.created_ms != created_ms:
        raise RunExistsError(paths.run_id, f"{paths.dir} (a different run with the same id)")
    if local_seq > remote_seq:
        log.warning(
            "run %s: the local copy's checkpoints %d..%d are not on the remote; they are "
            "dropped (written after the lease moved, or never pushed)",
            paths.run_id,
            remote_seq + 1,
            local_seq,
        )


def _take(bucket: Bucket, lease: Lease) -> None:
    if not create_lease(bucket, lease):
        remote = read_remote_run(bucket, lease.run_id)
        holder = remote.head if remote is not None else lease
        raise lease_lost(bucket, lease.run_id, holder, None)
    log.info("run %s: lease epoch %d taken on %s", lease.run_id, lease.epoch, bucket.url)


def _publish(store: Store, tmp: RunPaths, target: RunPaths, *, replace: bool) -> None:
    if not replace:
        try:
            fsio.publish_dir(tmp.dir, target.dir)
        except FileExistsError:
            raise RunExistsError(target.run_id, str(target.dir)) from None
        return
    # Two renames under the old copy's lock: a crash between them leaves the run
    # missing locally (the remote still has it), never half of it.
    fsio.fsync_dir(tmp.dir)
    trash = fsio.temp_path(store.runs_dir, f"deleted-{target.run_id}")
    fsio.rename(target.dir, trash)
    fsio.rename(tmp.dir, target.dir)
    fsio.fsync_dir(store.runs_dir)
    shutil.rmtree(trash, ignore_errors=True)


__all__ = ["PullReport", "RemoteIntegrityError", "pull_run", "take_run"]
