"""Cancelling a run: make it terminal so that nothing resumes it again.

The decision is taken under the run's lock: a status read before taking the lock
may be stale by the time the lock is ours (the owner may complete and release
it meanwhile, above all when the store waits for locks, ``lock_timeout``), so
the status is read again once the lock is held and a run that completed is
left completed.
"""

from __future__ import annotations

from afk_local.storage.format.records import RunStatus
from afk_local.storage.store import StoreLike, as_store


def cancel(run_id: str, *, store: StoreLike = None, reason: str = "cancelled") -> None:
    """Make run ``run_id`` terminal (``cancelled``); it is never resumed again.

    Raises:
        RunLockedError: the run is running in some process right now.
        ValueError: it already completed (also when it completed while cancel
            waited for its lock).
    """
    the_store = as_store(store)
    meta = the_store.read_meta(run_id)
    if meta.status is RunStatus.CANCELLED:
        return
    _refuse_completed(run_id, meta.status)
    with the_store.resume_writer(run_id, new_attempt=False) as run:
        status = run.meta.status  # read under the lock: this is the one that counts
        if status is RunStatus.CANCELLED:
            return
        _refuse_completed(run_id, status)
        run.cancel(reason)
        run.update_meta(extra={**run.meta.extra, "cancel_reason": reason})


def _refuse_completed(run_id: str, status: RunStatus) -> None:
    if status is RunStatus.COMPLETED:
        raise ValueError(f"run {run_id!r} already completed; there is nothing to cancel")


__all__ = ["cancel"]
