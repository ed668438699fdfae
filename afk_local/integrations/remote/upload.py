"""Uploading one local run into the epoch of the lease its store holds.

A :class:`RunUploader` is what ``afk-local push`` and the background mirror share:
it takes (or checks) the run's lease, lists what the remote already has in this
store's epoch, and uploads what is missing, in the order a reader can rely on:
the journal first (a journal ahead of the checkpoints is safe, one behind is not),
then the immutable files by seq, then ``run.meta``. Every object is created with
``If-None-Match: *`` and never overwritten, so running it again, or after a kill,
uploads only what is still missing.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from afk_local.errors import LeaseLostError, MirrorError
from afk_local.integrations.remote.bucket import Bucket, BucketRequestError
from afk_local.integrations.remote.layout import (
    MAX_META_BYTES,
    SEGMENT_CUT_BYTES,
    file_key,
    file_seq,
    meta_key,
    segment_key,
)
from afk_local.integrations.remote.lease import (
    Lease,
    create_lease,
    lease_lost,
    new_lease,
    read_leases,
    superseded,
)
from afk_local.integrations.remote.remote_run import read_remote_run
from afk_local.storage import fsio
from afk_local.storage.format.frames import MAX_FRAME_BYTES
from afk_local.storage.format.integrity import Signer
from afk_local.storage.format.journal_format import FrameReader
from afk_local.storage.format.layout import RunPaths
from afk_local.storage.rundir.mirror import mark_fenced

log = logging.getLogger("afk_local")

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


@dataclass
class PushReport:
    """What one push of one run uploaded."""

    run_id: str
    epoch: int = 0
    files: int = 0
    bytes: int = 0
    journal_bytes: int = 0
    meta: bool = False

    @property
    def up_to_date(self) -> bool:
        """True when nothing needed uploading."""
        return not (self.files or self.journal_bytes or self.meta)


def local_files(paths: RunPaths) -> list[tuple[int, str]]:
    """The run's immutable files the mirror carries, as (seq, name), by seq."""
    found = []
    with os.scandir(paths.dir) as entries:
        for entry in entries:
            seq = file_seq(entry.name)
            if seq is not None and entry.is_file(follow_symlinks=False):
                found.append((seq, entry.name))
    found.sort()
    return found


def durable_journal_end(paths: RunPaths) -> int:
    """The length of ``effects.log`` up to its last whole frame (0 without a journal).

    A torn tail that a crash left (and no writer has repaired yet) is not uploaded.
    """
    try:
        fd = os.open(paths.journal, os.O_RDONLY | _O_NOFOLLOW)
    except FileNotFoundError:
        return 0
    try:
        frames = FrameReader(fd, paths.journal, paths.run_id, MAX_FRAME_BYTES, None)
        # Whole frames only: readers judge their order (a pull refuses it, in one line).
        return frames.scan(os.fstat(fd).st_size, lambda _o, _n, _h: None, ordered=False).end
    finally:
        os.close(fd)


class RunUploader:
    """Uploads a local run's missing objects into this store's epoch of its lease.

    Args:
        bucket: the remote.
        paths: the local run directory.
        owner: this store's id (:func:`~afk_local.integrations.remote.identity.store_id`).
        signer: a keyed store's signer: leases are signed, unsigned ones refused.
    """

    def __init__(
        self, bucket: Bucket, paths: RunPaths, owner: str, signer: Signer | None = None
    ) -> None:
        self.bucket = bucket
        self.signer = signer
        self.paths = paths
        self.run_id = paths.run_id
        self.owner = owner
        self.lease: Lease | None = None
        self._present: set[str] = set()
        self.journal_uploaded = 0
        self._meta_version = 0
        self._meta_uploaded: bytes | None = None

    @property
    def meta_version(self) -> int:
        """The newest run.meta version of this epoch on the remote, as far as this knows."""
        return self._meta_version

    @property
    def epoch(self) -> int:
        """The epoch this store holds (0 before :meth:`acquire`)."""
        return self.lease.epoch if self.lease is not None else 0

    # -- the lease ----------------------------------------------------------------

    def acquire(self) -> Lease:
        """Check that this store holds the run's newest lease, creating epoch 1 if none.

        Raises:
            LeaseLostError: another store holds it (the local copy is marked fenced when
                this store held an older epoch).
            MirrorError: this store's take of the run has not finished (no bases yet).
        """
        leases = read_leases(self.bucket, self.run_id, self.signer)
        if not leases:
            first = new_lease(self.run_id, 1, self.owner)
            if create_lease(self.bucket, first, self.signer):
                log.info("run %s: lease epoch 1 taken on %s", self.run_id, self.bucket.url)
                self.lease = first
                return first
            leases = read_leases(self.bucket, self.run_id, self.signer)  # lost the race
        head = leases[max(leases)]
        if head.owner != self.owner:
            mine = max((e for e, lease in leases.items() if lease.owner == self.owner), default=0)
            raise self._fenced(lease_lost(self.bucket, self.run_id, head, mine or None), mine)
        if not head.settled:
            raise MirrorError(
                self.bucket.url,
                f"run {self.run_id}: this store's take (epoch {head.epoch}) did not finish: run "
                f"`afk-local pull {self.run_id} --take --from {self.bucket.url}` again",
            )
        self.lease = head
        return head

    def check_lease(self) -> None:
        """Raise LeaseLostError when a newer epoch than ours exists (one existence check)."""
        if self.lease is None:
            self.acquire()
            return
        if superseded(self.bucket, self.run_id, self.epoch):
            leases = read_leases(self.bucket, self.run_id, self.signer)
            head = leases[max(leases)]
            raise self._fenced(lease_lost(self.bucket, self.run_id, head, self.epoch), self.epoch)

    def _fenced(self, error: LeaseLostError, my_epoch: int) -> LeaseLostError:
        """Mark the local copy fenced when this store held an older epoch; the error."""
        if my_epoch:
            mark_fenced(self.paths, self.bucket.url, str(error))
        return error

    # -- what the remote has ------------------------------------------------------

    def scan_remote(self) -> None:
        """List what our epoch holds already (files, journal coverage, meta versions)."""
        lease = self.lease or self.acquire()
        remote = read_remote_run(self.bucket, self.run_id, self.signer)
        objects = remote.objects(lease.epoch) if remote is not None else None
        if objects is None:
            self._present, self.journal_uploaded, self._meta_version = set(), lease.journal_base, 0
            return
        self._present = set(objects.files)
        self.journal_uploaded = objects.journal_end(lease.journal_base)
        self._meta_version = max(objects.metas, default=0)
        if self._meta_version:
            self._meta_uploaded = self.bucket.get(
                meta_key(self.run_id, lease.epoch, self._meta_version), MAX_META_BYTES
            )
        else:
            self._meta_uploaded = lease.meta

    def missing_files(self, max_seq: int | None = None) -> list[str]:
        """Local files of this epoch the remote lacks, by seq.

        This epoch's files are those above the lease's base seq; with ``max_seq``,
        only those up to it (what the writer has acknowledged).
        """
        base = self.lease.base_seq if self.lease is not None else 0
        return [
            name
            for seq, name in local_files(self.paths)
            if (seq == 0 or seq > base)
            and (max_seq is None or seq <= max_seq)
            and name not in self._present
        ]

    # -- uploading ----------------------------------------------------------------

    def upload_journal(self, end: int) -> int:
        """Upload ``effects.log`` from what the remote has up to byte ``end``; bytes sent."""
        sent = 0
        if end < self.journal_uploaded:
            log.warning(
                "run %s: local effects.log (%d bytes) is shorter than the %d bytes on %s "
                "(trimmed by gc?): the remote keeps the longer journal",
                self.run_id,
                end,
                self.journal_uploaded,
                self.bucket.url,
            )
            return 0
        while self.journal_uploaded < end:
            offset = self.journal_uploaded
            chunk = _read_range(self.paths.journal, offset, min(end - offset, SEGMENT_CUT_BYTES))
            if not chunk:
                raise MirrorError(
                    self.bucket.url, f"{self.paths.journal} is shorter than {end} bytes"
                )
            key = segment_key(self.run_id, self.epoch, offset)
            if self.bucket.create(key, chunk):
                sent += len(chunk)
                self.journal_uploaded = offset + len(chunk)
                continue
            # An earlier attempt (killed, or timed out after the server stored it) made it.
            size = self.bucket.size(key)
            if not size:
                raise MirrorError(self.bucket.url, f"{key} exists but is empty")
            self.journal_uploaded = offset + size
        return sent

    def upload_after_fence(self, end: int) -> None:
        """Once a newer epoch exists: upload the journal up to ``end`` to this (old) epoch
        all the same, best effort. Past the new epoch's bases it is ignored by readers; a
        taker that waits for this holder's lease to lapse before it lists (a revival raced
        its take) finds there the intents of effects this holder started meanwhile."""
        try:
            self.upload_journal(end)
        except (BucketRequestError, MirrorError, OSError) as exc:
            log.info("run %s: journal tail not uploaded after the fence: %s", self.run_id, exc)

    def upload_file(self, name: str) -> int:
        """Upload one immutable run file unless our epoch has it; bytes sent."""
        if name in self._present:
            return 0
        try:
            data = fsio.read_bounded(self.paths.dir / name, 1 << 40)
        except FileNotFoundError:
            log.warning("run %s: %s vanished before it was uploaded", self.run_id, name)
            return 0
        created = self.bucket.create(file_key(self.run_id, self.epoch, name), data)
        self._present.add(name)
        return len(data) if created else 0

    def read_meta(self) -> bytes | None:
        """``run.meta`` as it is now: read BEFORE the files a batch uploads, so the meta
        uploaded after them never describes a file the remote does not have yet."""
        try:
            return fsio.read_bounded(self.paths.meta, MAX_META_BYTES)
        except FileNotFoundError:
            return None

    def upload_meta(self, data: bytes | None) -> bool:
        """Upload ``data`` (from :meth:`read_meta`) as a new version of ``run.meta`` unless
        the newest one is the same."""
        if data is None or data == self._meta_uploaded:
            return False
        while not self.bucket.create(
            meta_key(self.run_id, self.epoch, self._meta_version + 1), data
        ):
            self._meta_version += 1  # a version made by an earlier process of this store
        self._meta_version += 1
        self._meta_uploaded = data
        return True

    def push(self, *, concurrency: int = 16) -> PushReport:
        """Upload everything the remote lacks: journal, files by seq, meta.

        Raises:
            LeaseLostError: another store holds the run's lease.
            MirrorError: a request failed (after obstore's retries).
        """
        lease = self.acquire()
        self.scan_remote()
        meta = self.read_meta()  # before the files: see read_meta
        report = PushReport(self.run_id, epoch=lease.epoch)
        report.journal_bytes = self.upload_journal(durable_journal_end(self.paths))
        names = self.missing_files()
        if concurrency <= 1 or len(names) <= 1:
            sizes = [self.upload_file(name) for name in names]
        else:
            with ThreadPoolExecutor(concurrency, thread_name_prefix="afk-push") as pool:
                sizes = list(pool.map(self.upload_file, names))
        report.files = sum(1 for size in sizes if size)
        report.bytes = sum(sizes)
        report.meta = self.upload_meta(meta)
        return report


def _read_range(path: Path, offset: int, length: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | _O_NOFOLLOW)
    try:
        return os.pread(fd, length, offset)
    finally:
        os.close(fd)


__all__ = ["PushReport", "RunUploader", "durable_journal_end", "local_files"]
