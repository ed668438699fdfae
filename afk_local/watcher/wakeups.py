"""Wake-ups: which parked (``sleeping``) runs are due, by the clock durable time reads.

A run that parked in a long ``ctx.sleep`` has status ``sleeping`` and
``wake_at_ms`` in its ``run.meta``; nobody holds its lock. The watcher resumes it
like an interrupted run once the clock (:func:`afk_local.clock.current_clock`,
wall time) reaches ``wake_at_ms``, and never before. Nothing is kept in memory:
after a reboot the next sweep finds it the same way.
"""

from __future__ import annotations

import datetime as dt

from afk_local.clock import clock_ms
from afk_local.storage.format.records import RunMeta, RunStatus


def due_to_wake(meta: RunMeta, now_ms: int | None = None) -> bool:
    """True when ``meta`` is a parked run whose wake-up time has come."""
    if meta.status is not RunStatus.SLEEPING:
        return False
    return meta.wake_at_ms <= (clock_ms() if now_ms is None else now_ms)


def wake_time_text(wake_at_ms: int) -> str:
    """``wake_at_ms`` as local ISO time (for events and listings)."""
    return dt.datetime.fromtimestamp(wake_at_ms / 1000).astimezone().isoformat(timespec="seconds")


__all__ = ["due_to_wake", "wake_time_text"]
