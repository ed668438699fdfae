"""Cancelling a run: make it terminal so that nothing resumes it again."""

from __future__ import annotations

from afk_local.storage.records import RunStatus
from afk_local.storage.store import StoreLike, as_store


def cancel(run_id: str, *, store: StoreLike = None, reason: str = "cancelled") -> None:
    """Make run ``run_id`` terminal (``cancelled``); it is never resumed again.

    Raises:
        RunLockedError: the run is running in some process right now.
        ValueError: it already completed.
    """
    the_store = as_store(store)
    meta = the_store.read_meta(run_id)
    if meta.status is RunStatus.CANCELLED:
        return
    if meta.status is RunStatus.COMPLETED:
        raise ValueError(f"run {run_id!r} already completed; there is nothing to cancel")
    with the_store.resume_writer(run_id) as run:
        run.cancel(reason)
        run.update_meta(extra={**run.meta.extra, "cancel_reason": reason})


__all__ = ["cancel"]
