"""Durable sleep: a due time journaled once, waited for in-process or by parking the run.

``ctx.sleep(seconds)`` and ``ctx.sleep_until(when)`` (and the backoff between the
attempts of a retried step) record the due time as a journaled call named
``@sleep``: the first attempt decides it, every later one replays it, so a kill
during the wait resumes only the rest. A wait longer than ``park_after`` seconds
*parks* the run: it checkpoints, ``run.meta`` says ``sleeping`` with ``wake_at_ms``,
and :class:`~afk_local.RunSleeping` ends the process's attempt; ``afk-local watch``
resumes it when due (docs/time.md).

Due times are wall-clock milliseconds from :func:`afk_local.clock.current_clock`.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable

from afk_local.clock import current_clock
from afk_local.journal.journal import Journal

log = logging.getLogger("afk_local")

SLEEP_NAME = "@sleep"
"""The journaled name of a sleep's due time (its key is ``@sleep#n``)."""

DEFAULT_PARK_AFTER_S = 60.0
"""Waits longer than this park the run instead of blocking its process."""

Park = Callable[[int], None]
"""Parks the run until the given due time (ms); raises, never returns."""


def as_epoch_s(when: float | dt.datetime) -> float:
    """``when`` as seconds since the epoch: a number as is, a naive datetime as local time."""
    if isinstance(when, dt.datetime):
        return when.timestamp()
    if isinstance(when, (int, float)) and not isinstance(when, bool):
        return float(when)
    raise TypeError(f"a wake-up time is a datetime or seconds since the epoch, not {when!r}")


def journaled_due(journal: Journal, key: str, due: Callable[[], float], *, step: int) -> int:
    """The due time (ms) of the sleep ``key``: ``due()`` on its first call, replayed after.

    A crash between the intent and the outcome leaves the record in doubt; it is
    decided again (the wait restarts from then, never shortens).
    """

    def decide() -> int:
        return int(due() * 1000)

    value = journal.call(key, decide, name=SLEEP_NAME, step=step, idempotent=True)
    return int(value)


def wait_until(due_ms: int, *, park_after: float | None, park: Park) -> None:
    """Return once the clock reaches ``due_ms``; park the run when that is too far off.

    The wait re-reads the wall clock, so time spent suspended counts, and a clock
    stepped forward ends the wait early; one stepped back lengthens it (the due time
    is a point on the calendar).
    """
    clock = current_clock()
    remaining = due_ms / 1000 - clock.time()
    if remaining <= 0:
        return
    if park_after is not None and remaining > park_after:
        park(due_ms)
        raise AssertionError("park() returned")  # pragma: no cover - park always raises
    while remaining > 0:
        clock.sleep(remaining)
        remaining = due_ms / 1000 - clock.time()


__all__ = [
    "DEFAULT_PARK_AFTER_S",
    "SLEEP_NAME",
    "Park",
    "as_epoch_s",
    "journaled_due",
    "wait_until",
]
