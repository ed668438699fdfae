"""``Store(root, mirror=URL)``: every acknowledged record uploaded in the background.

:func:`open_remote_mirror` is what the ``afk_local.mirrors`` entry points name. When
a writer opens a run, :meth:`RemoteMirror.attach` checks the run's lease right away
(a run another store holds is refused before anything is written) and starts one
uploader thread for the run. The writer's notifications only record what to send:
names of published files (a bounded queue; past its bound the thread falls back to
listing what is missing), the journal's durable length, a dirty flag for run.meta.
The thread uploads them in order: journal, files, meta, where the meta is read from
disk BEFORE the batch fixes its files (so the remote never shows a meta ahead of the
files it describes). It checks that no newer lease exists before each batch and
again after the journal upload: with ``sync_effects`` an append waits for that batch,
so an intent is on the remote and the lease still ours before its effect runs. Once
a newer lease exists the local copy is marked fenced and the run's writer refuses
every further checkpoint and effect with LeaseLostError.

While the run is open a :class:`~.renewer.LeaseRenewer` renews the lease
(``<run>/lease/<epoch>.alive``) every sixth of ``lease_s`` on its own timer (an upload
batch that takes long on a slow link delays no renewal), and after each renewal checks
that its link of the lease chain still stands. The owner fences itself on its own
monotonic clock: no effect starts
(its journal append waits) while the last successful renewal is older than ``lease_s``
minus the safety margin (``MARGIN_FRACTION``), since a taker may treat the lease as
lapsed soon after; a pause of the whole process (SIGSTOP, a step holding the GIL) is
seen at the next effect. With the background mirror a renewal sent while not fresh (a
session's first, or one after a lapse) is a revival: effects wait for a second renewal
(renewer.py), and a session's first effect also waits for the batch that uploads the
meta it wrote on opening (so a release an earlier session wrote, put back, no longer
matches the remote). A mirror that gave up stops the run: every later checkpoint and
effect raises LeaseLostError; one that found a newer epoch first uploads its journal's
durable tail to its own epoch (a taker that raced a revival waits for it).

A request that fails is retried with backoff for ``retry_for_s`` seconds; then the
mirror stops and its error is raised by the writer's next flush and by its close
(logged when it happens), and as LeaseLostError by its next checkpoint or effect. A
short outage only delays effects (until a renewal succeeds); what was not uploaded is
uploaded by the next writer of the run that has this mirror, or by ``afk-local push``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from pathlib import Path

from afk_local.errors import LeaseLostError, MirrorError
from afk_local.integrations.remote.bucket import Bucket, BucketRequestError
from afk_local.integrations.remote.identity import store_id
from afk_local.integrations.remote.layout import file_seq
from afk_local.integrations.remote.lease import DEFAULT_LEASE_S
from afk_local.integrations.remote.renewer import LeaseRenewer
from afk_local.integrations.remote.upload import RunUploader, durable_journal_end, local_files
from afk_local.storage.format.codec import RecordCodec
from afk_local.storage.format.layout import RunPaths

log = logging.getLogger("afk_local")

DEFAULT_RETRY_FOR_S = 60.0
DEFAULT_CLOSE_TIMEOUT_S = 60.0
DEFAULT_MAX_PENDING = 10_000
"""Queued file names per run; beyond it the uploader lists what is missing instead."""
ATTACH_WAIT_S = 2.0
"""How long opening a mirrored run waits for the remote's lease check before going on."""


class RunMirrorThread:
    """Mirrors one run that a writer holds; satisfies
    :class:`~afk_local.storage.rundir.mirror.RunMirror`.

    Args:
        uploader: uploads into this store's epoch of the run's lease.
        retry_for_s: how long failing requests are retried before the mirror stops.
        close_timeout_s: how long :meth:`close` waits for pending uploads.
        max_pending: queued file names before the queue collapses into one listing.
        sync_effects: each journal record is uploaded before its append returns, so a
            step's intent is in the remote before its function runs and its outcome
            before its result is used (a fan-out worker whose machine dies loses no
            effect); a mirror that cannot keep up within ``close_timeout_s`` fails the
            append with MirrorError.
        lease_s: the lease period: the lease is renewed every sixth of it while the run
            is open; no effect starts once the last renewal is older than ``lease_s``
            minus the safety margin; a taker treats a background-mirrored holder silent
            for ``lease_s`` plus the margin as gone.
    """

    def __init__(
        self,
        uploader: RunUploader,
        *,
        retry_for_s: float = DEFAULT_RETRY_FOR_S,
        close_timeout_s: float = DEFAULT_CLOSE_TIMEOUT_S,
        max_pending: int = DEFAULT_MAX_PENDING,
        sync_effects: bool = False,
        lease_s: float = DEFAULT_LEASE_S,
    ) -> None:
        self.uploader = uploader
        self._lease_s = lease_s
        self._uploaded_seq = 0
        self._attached = threading.Event()
        self.run_id = uploader.run_id
        self.url = uploader.bucket.url
        self._retry_for_s = retry_for_s
        self._close_timeout_s = close_timeout_s
        self._max_pending = max_pending
        self._sync_effects = sync_effects
        self._cond = threading.Condition()
        self._files: deque[str] = deque()
        self._journal_end = 0
        self._acked_seq = 0
        self._meta_changes = 0
        self._catch_up = True  # list the remote and upload what it lacks (first batch, overflow)
        self._overflows = 0
        self._requested = 1
        self._completed = 0
        self._error: BaseException | None = None
        self._opened: int | None = None
        """The batch that uploads the meta this session wrote when it opened the run."""
        self._surfaced = False
        self._stopping = False
        self._thread = threading.Thread(
            target=self._run, name=f"afk-mirror-{self.run_id}", daemon=True
        )
        self._renewer = LeaseRenewer(
            uploader,
            lease_s=lease_s,
            retry_for_s=retry_for_s,
            sync_effects=sync_effects,
            cond=self._cond,
            failed=lambda: self._error is not None,
            fail=self._fail,
            uploaded_seq=lambda: self._uploaded_seq,
        )

    def start(self) -> None:
        """Start the thread; wait (at most ``ATTACH_WAIT_S``) for its lease check and raise
        LeaseLostError if another store holds the run.

        Unreachable or hanging remote: the run goes on locally and the thread keeps trying.
        """
        # What is on disk now (no writer runs yet) counts as acknowledged; later,
        # only what the writer notifies. Nothing newer is ever uploaded.
        files = local_files(self.uploader.paths)
        self._acked_seq = files[-1][0] if files else 0
        self._journal_end = durable_journal_end(self.uploader.paths)
        self._thread.start()
        self._renewer.start()
        if not self._attached.wait(ATTACH_WAIT_S):
            log.warning(
                "run %s: mirror %s did not answer within %g s; going on locally, the lease "
                "is checked in the background",
                self.run_id,
                self.url,
                ATTACH_WAIT_S,
            )
        error = self._error
        if isinstance(error, LeaseLostError):
            self._surfaced = True
            self.close()
            raise error

    def uploaded_seq(self) -> int:
        """Every file up to this seq is on the remote (never waits)."""
        return self._uploaded_seq

    # -- notifications from the writer (enqueue only) -----------------------------

    def published(self, name: str) -> None:
        """An immutable run file was published (acknowledged)."""
        with self._cond:
            self._acked_seq = max(self._acked_seq, file_seq(name) or 0)
            if len(self._files) >= self._max_pending:
                self._files.clear()
                self._catch_up = True
                self._overflows += 1
            else:
                self._files.append(name)
            self._requested += 1
            self._cond.notify_all()

    def meta_replaced(self) -> None:
        """``run.meta`` changed."""
        with self._cond:
            self._meta_changes += 1
            self._requested += 1
            if self._opened is None:
                self._opened = self._requested
            self._cond.notify_all()

    def synced(self, end: int) -> None:
        """``effects.log`` is durable up to ``end``."""
        with self._cond:
            if end > self._journal_end:
                self._journal_end = end
                self._requested += 1
                self._cond.notify_all()

    def appended(self, end: int) -> None:
        """With ``sync_effects``, wait until the journal up to ``end`` is in the remote."""
        if self._sync_effects:
            self.flush(self._close_timeout_s)

    def before_append(self) -> None:
        """Refuse an effect once the lease is lost or the mirror stopped (with
        ``sync_effects``, the mirror's own error: the record could not be made
        remote-durable); wait while the lease may have lapsed by this machine's clock."""
        if self._sync_effects and self._error is not None:
            self._surfaced = True
            raise self._error
        self.check()
        with self._cond:
            while self._error is None and not (self._renewer.fresh() and self._session_shown()):
                self._cond.wait(0.5)  # the renewer notifies; the bound re-reads the clock
        self.check()

    def _session_shown(self) -> bool:
        """(background) The meta this session wrote on opening is on the remote: a release an
        earlier session wrote, replayed, no longer matches what the remote holds, so no take
        treats this session as closed (with ``sync_effects`` each intent is fenced anyway).
        Called with the condition held."""
        return self._sync_effects or self._opened is None or self._completed >= self._opened

    def check(self) -> None:
        """Raise LeaseLostError once another store took the run, or once the mirror
        stopped (the lease is no longer renewed: the run fences itself)."""
        error = self._error
        if error is None:
            return
        self._surfaced = True
        if isinstance(error, LeaseLostError):
            raise error
        raise LeaseLostError(
            self.run_id,
            self.url,
            f"its mirror stopped ({error}), so its lease is no longer renewed and another "
            "store may take the run: this writer fenced itself",
            next_step=f"Resume it once the remote answers (`afk-local resume {self.run_id}`)",
        ) from error

    # -- waiting ------------------------------------------------------------------

    def flush(self, timeout: float) -> None:
        """Wait until everything notified so far is uploaded (at most ``timeout`` s).

        Raises:
            LeaseLostError / MirrorError: the mirror stopped on this error.
            MirrorError: it did not catch up in time.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            target = self._requested
            while self._completed < target and self._error is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise MirrorError(
                        self.url,
                        f"run {self.run_id}: uploads not done within {timeout:g} s (the remote is "
                        "slow or unreachable); they go on in the background, and `afk-local "
                        f"push {self.run_id} --to {self.url}` sends whatever is left",
                    )
                self._cond.wait(remaining)
            if self._error is not None:
                self._surfaced = True
                raise self._error

    def close(self) -> None:
        """Wait for pending uploads (bounded), release the lease's renewal, stop the
        threads, raise the mirror's error."""
        try:
            if not (self._surfaced and self._error is not None):
                self.flush(self._close_timeout_s)
                self._renewer.stop(self._close_timeout_s)  # no renewal lands after the release
                self._release()
        finally:
            with self._cond:
                self._stopping = True
                self._cond.notify_all()
            self._renewer.stop(1.0)
            if self._thread.is_alive() and self._thread is not threading.current_thread():
                self._thread.join(1.0)

    def _release(self) -> None:
        """Tell takers this holder stopped (best effort: a lapse says the same, later)."""
        uploader = self.uploader
        if uploader.lease is None or self._error is not None:
            return
        try:
            uploader.check_lease()
            self._renewer.release()
        except (BucketRequestError, LeaseLostError, MirrorError) as exc:
            log.info("run %s: lease renewal not released: %s", self.run_id, exc)

    # -- the uploader thread --------------------------------------------------------

    def _run(self) -> None:
        failing_since: float | None = None
        delay = 0.2
        while True:
            with self._cond:
                while self._completed >= self._requested and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                meta_seen = self._meta_changes
            # The meta is read before the files are fixed (module docstring).
            meta = self.uploader.read_meta() if meta_seen or self._catch_up else None
            with self._cond:
                target = self._requested
                files = list(self._files)
                journal_end = self._journal_end
                overflows = self._overflows
                catch_up = self._catch_up
                acked_seq = self._acked_seq
            try:
                self._upload(files, journal_end, meta, catch_up, acked_seq)
            except BucketRequestError as exc:
                self._attached.set()
                now = time.monotonic()
                failing_since = failing_since or now
                if exc.retryable and now - failing_since < self._retry_for_s:
                    log.info("run %s: mirror upload failed, retrying: %s", self.run_id, exc)
                    with self._cond:
                        self._cond.wait(delay)  # a close() cuts the wait short
                    delay = min(delay * 2, 10.0)
                    continue
                self._fail(exc)
                return
            except (LeaseLostError, MirrorError, OSError) as exc:
                self._fail(exc)
                return
            failing_since, delay = None, 0.2
            with self._cond:
                # Drop what was sent; what was notified meanwhile stays for the next batch.
                if overflows == self._overflows:  # else the queue was folded into a catch-up
                    self._catch_up = False
                    for _ in files:
                        self._files.popleft()
                self._meta_changes -= meta_seen
                self._uploaded_seq = max(self._uploaded_seq, acked_seq)
                self._completed = max(self._completed, target)
                self._cond.notify_all()

    def _upload(
        self, files: list[str], journal_end: int, meta: bytes | None, catch_up: bool, acked_seq: int
    ) -> None:
        uploader = self.uploader
        if uploader.lease is None:
            uploader.acquire()
            with self._cond:
                self._cond.notify_all()  # the renewer waits for the lease
        else:
            uploader.check_lease()
        self._attached.set()
        if catch_up:
            uploader.scan_remote()
        pinned = uploader.journal_uploaded
        uploader.upload_journal(journal_end)
        if self._sync_effects and uploader.journal_uploaded > pinned:
            # Pin the journal's new end before the check: a taker that lists after it
            # and misses the intent (a segment deleted) refuses the run, not re-runs it.
            self._renewer.pin()
        # Checked again AFTER the journal: an intent is now on the remote, so a taker
        # that created its lease after this check lists it (and reports it in doubt).
        uploader.check_lease()
        for name in uploader.missing_files(acked_seq) if catch_up else files:
            uploader.upload_file(name)
        if meta is not None:
            uploader.upload_meta(meta)

    def _fail(self, exc: BaseException) -> None:
        if isinstance(exc, LeaseLostError):
            log.error("run %s: %s", self.run_id, exc)
            if self.uploader.lease is not None:
                with self._cond:
                    end = self._journal_end
                self.uploader.upload_after_fence(end)
        else:
            log.error("run %s: mirror %s stopped: %s", self.run_id, self.url, exc)
        with self._cond:
            self._error = exc
            self._cond.notify_all()
        self._attached.set()


class RemoteMirror:
    """A store's mirror on one remote; satisfies :class:`~afk_local.storage.rundir.mirror.Mirror`.

    Args:
        url: the remote (``s3://bucket/prefix``, ``gs://...``, ``az://...``, ``file:///dir``).
        root: the store's root (its ``store.id`` names the lease owner).
        retry_for_s / close_timeout_s / max_pending / sync_effects / lease_s: see
            :class:`RunMirrorThread`.
    """

    def __init__(
        self,
        url: str,
        *,
        root: Path,
        retry_for_s: float = DEFAULT_RETRY_FOR_S,
        close_timeout_s: float = DEFAULT_CLOSE_TIMEOUT_S,
        max_pending: int = DEFAULT_MAX_PENDING,
        sync_effects: bool = False,
        lease_s: float = DEFAULT_LEASE_S,
    ) -> None:
        self.url = url
        self.sync_effects = sync_effects
        self.lease_s = lease_s
        self.root = Path(root)
        self.bucket = Bucket(url)
        self._retry_for_s = retry_for_s
        self._close_timeout_s = close_timeout_s
        self._max_pending = max_pending
        self._owner: str | None = None

    def __repr__(self) -> str:
        return f"RemoteMirror({self.url!r})"

    def attach(self, paths: RunPaths, record_codec: RecordCodec) -> RunMirrorThread:
        """Start mirroring a run (the caller holds its lock); LeaseLostError if not ours."""
        if self._owner is None:
            self._owner = store_id(self.root)
        mirror = RunMirrorThread(
            RunUploader(self.bucket, paths, self._owner, record_codec.signer),
            retry_for_s=self._retry_for_s,
            close_timeout_s=self._close_timeout_s,
            max_pending=self._max_pending,
            sync_effects=self.sync_effects,
            lease_s=self.lease_s,
        )
        mirror.start()
        return mirror

    def close(self) -> None:
        """Nothing to release: each run's thread stops with its writer."""


def open_remote_mirror(url: str, *, root: Path) -> RemoteMirror:
    """The ``afk_local.mirrors`` entry point: a :class:`RemoteMirror` of the store at ``root``."""
    return RemoteMirror(url, root=root)


__all__ = ["RemoteMirror", "RunMirrorThread", "open_remote_mirror"]
