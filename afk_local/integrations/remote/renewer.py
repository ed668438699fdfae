"""A mirrored run's lease renewals, on their own timer, and the holder's self-fencing.

:class:`LeaseRenewer` replaces ``<run>/lease/<epoch>.alive`` every sixth of ``lease_s``
from a thread of its own (an upload batch that takes long on a slow link delays no
renewal) and, after each renewal, checks that no newer epoch exists and that its own
link of the lease chain (its lease and bases objects) still stands. Each renewal
carries the writer session's random nonce, a counter, and what the holder has
confirmed on the remote (journal length, newest seq): a take refuses a remote that
holds less. Renewals from two threads (the timer, and with ``sync_effects`` the pin
after each journal upload) are serialised, so the one written last never carries the
older pins.

:meth:`LeaseRenewer.fresh` is the self-fencing test: a renewal sent less than
``lease_s`` minus the safety margin ago, by this process's monotonic clock.

A holder that was not fresh when it renewed (its session's first renewal, or one after a
pause or an outage longer than the lease) may have been found lapsed by a taker that is
about to create its lease: with the background mirror its next effect's intent would
not be on the remote when that taker lists. So such a renewal is a *revival*: it makes
the holder fresh only once a renewal sent :data:`~.lease.REVIVAL_WAIT_S` after it has checked
the lease again. A taker re-reads the renewal right before its create and refuses a
revived holder (:func:`~.take.reread_renewal`). A taker whose create ended longer than
that wait after its re-read, the renewal changed meanwhile, waits for the holder's lease
to lapse before it lists again (:func:`~.take.holder_may_live`): the holder sees the new epoch
at its next renewal and uploads its journal's tail before it stops renewing
(:meth:`~.upload.RunUploader.upload_after_fence`). Whichever comes first, the holder's
check or the taker's re-read, sees the other. With ``sync_effects`` every intent is on the
remote and the lease checked before its effect runs, so no wait is needed.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable

from afk_local.errors import LeaseLostError, MirrorError
from afk_local.integrations.remote.bucket import BucketRequestError
from afk_local.integrations.remote.lease import (
    MARGIN_FRACTION,
    REVIVAL_WAIT_S,
    check_chain,
    renew,
)
from afk_local.integrations.remote.upload import RunUploader

log = logging.getLogger("afk_local")

RENEWALS_PER_LEASE = 6
"""Renewals per lease period: a few may fail before the holder fences itself."""


class LeaseRenewer:
    """Renews one run's lease for its mirror thread (which owns ``cond``).

    Args:
        uploader: the run's uploader (its lease, bucket and confirmed journal length).
        lease_s / retry_for_s / sync_effects: the mirror's settings.
        cond: the mirror's condition: the renewer notifies it after each renewal and
            waits on it for its next one (a close or a failure cuts the wait short).
        failed: whether the mirror stopped (the renewer stops too).
        fail: stops the mirror with an error (a lost lease, a broken chain, a remote
            that did not answer for ``retry_for_s``).
        uploaded_seq: every file up to this seq is on the remote.
    """

    def __init__(
        self,
        uploader: RunUploader,
        *,
        lease_s: float,
        retry_for_s: float,
        sync_effects: bool,
        cond: threading.Condition,
        failed: Callable[[], bool],
        fail: Callable[[BaseException], None],
        uploaded_seq: Callable[[], int],
    ) -> None:
        self.uploader = uploader
        self._lease_s = lease_s
        self._fence_after_s = lease_s * (1 - MARGIN_FRACTION)
        self._retry_for_s = retry_for_s
        self._sync_effects = sync_effects
        self._cond = cond
        self._failed = failed
        self._fail = fail
        self._uploaded_seq = uploaded_seq
        self._session = secrets.token_hex(8)
        self._renewals = 0
        self._renewed_at: float | None = None
        """When the last successful renewal was sent (monotonic); None before the first."""
        self._failed_at: float | None = None
        """When the last renewal that failed was sent (monotonic)."""
        self._sending_since: float | None = None
        """When the renewal in flight was sent (None: none in flight)."""
        self._last_sent: float | None = None
        """When the last successful renewal, a revival included, was sent (monotonic)."""
        self._revived_at: float | None = None
        """When a revival was sent (monotonic), until a renewal after the wait confirms it."""
        self._revival_wait_s = 0.0 if sync_effects else REVIVAL_WAIT_S
        self._running = True
        self._lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._loop, name=f"afk-lease-{uploader.run_id}", daemon=True
        )

    def start(self) -> None:
        """Start the timer thread (it waits until the uploader holds the lease)."""
        self._thread.start()

    def fresh(self) -> bool:
        """True while the last successful renewal is younger than ``lease_s`` minus the
        safety margin by this process's monotonic clock, and the remote answers: no
        renewal failed since it, and none has been in flight for a renewal period (an
        owner cut off from the remote starts no effect once it can tell, long before
        its lease would lapse). An effect may start."""
        renewed = self._renewed_at
        now = time.monotonic()
        if renewed is None or now - renewed >= self._fence_after_s:
            return False
        failed, sending = self._failed_at, self._sending_since
        if failed is not None and failed > renewed:
            return False
        return sending is None or now - sending < self._lease_s / RENEWALS_PER_LEASE

    def pin(self) -> None:
        """Replace the renewal with the pins as they are now (serialised)."""
        self._put(released=False)

    def release(self) -> None:
        """Write the last, released renewal (after :meth:`stop`): it also names the meta
        version the session left, so that a replay of it is told from a fresh one."""
        self._put(released=True)

    def stop(self, timeout: float) -> None:
        """Stop the timer thread (at most ``timeout`` s for a renewal in flight)."""
        with self._cond:
            self._running = False
            self._cond.notify_all()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _put(self, *, released: bool) -> None:
        uploader = self.uploader
        with self._lock:
            renew(
                uploader.bucket,
                uploader.run_id,
                uploader.epoch,
                sync_effects=self._sync_effects,
                lease_s=self._lease_s,
                session=self._session,
                counter=self._renewals,
                released=released,
                journal_end=uploader.journal_uploaded,
                head_seq=self._uploaded_seq(),
                meta_version=uploader.meta_version if released else -1,
                signer=uploader.signer,
            )
            self._renewals += 1

    def _loop(self) -> None:
        every = self._lease_s / RENEWALS_PER_LEASE
        failing_since: float | None = None
        due = 0.0
        while True:
            with self._cond:
                while self._running and not self._failed():
                    wait = due - time.monotonic()
                    if self.uploader.lease is not None and wait <= 0:
                        break
                    self._cond.wait(wait if self.uploader.lease is not None else 1.0)
                if not self._running or self._failed():
                    return
            sent = time.monotonic()
            try:
                due = self.tick()
            except BucketRequestError as exc:
                failing_since = failing_since or sent
                if exc.retryable and sent - failing_since < self._retry_for_s:
                    log.info(
                        "run %s: lease renewal failed, retrying: %s", self.uploader.run_id, exc
                    )
                    due = sent + min(every, 1.0)
                    continue
                self._fail(exc)
                return
            except (LeaseLostError, MirrorError) as exc:
                self._fail(exc)
                return
            failing_since = None

    def tick(self) -> float:
        """Renew once and check the chain (the timer's work, also what the interleaving
        explorer drives); returns when the next renewal is due (monotonic).

        Raises:
            BucketRequestError / LeaseLostError / MirrorError: the renewal or a check failed.
        """
        sent = self._sending_since = time.monotonic()
        try:
            self._renew_once()
        except BaseException:
            self._failed_at = sent
            raise
        finally:
            self._sending_since = None
        every = self._lease_s / RENEWALS_PER_LEASE
        with self._cond:
            # Valid from when it was SENT: the server stamps it later, never earlier.
            last, self._last_sent = self._last_sent, sent
            if self._revival_wait_s > 0 and (last is None or sent - last >= self._fence_after_s):
                self._revived_at = sent  # a revival: fresh only once confirmed (below)
                log.info(
                    "run %s: lease renewed at the session's start or after a lapse: effects "
                    "wait %g s for a second renewal",
                    self.uploader.run_id,
                    self._revival_wait_s,
                )
            elif self._revived_at is None or sent - self._revived_at >= self._revival_wait_s:
                self._renewed_at, self._revived_at = sent, None
            self._cond.notify_all()
            if self._revived_at is not None:
                return min(sent + every, self._revived_at + self._revival_wait_s)
        return sent + every

    def _renew_once(self) -> None:
        """Replace the renewal, then check the chain: a taker that read the renewal before
        this one and made its lease after this check saw a lapsed lease, which this
        writer had already fenced itself for."""
        uploader = self.uploader
        self.pin()
        uploader.check_lease()
        check_chain(
            uploader.bucket, uploader.run_id, uploader.epoch, uploader.owner, uploader.signer
        )


__all__ = ["RENEWALS_PER_LEASE", "LeaseRenewer"]
