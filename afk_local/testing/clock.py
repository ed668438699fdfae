"""A time-skipping clock, so tests of sleeps, retries and limits never wait.

In the spirit of Temporal's time-skipping test environment: while a
:class:`SkippingClock` is installed, every wait of durable time (``ctx.sleep``,
a retry's backoff, a limit's window, the watcher's wake-ups) returns at once and
moves the clock forward by what it would have waited.

Example:
    >>> from afk_local.testing import skipping_clock  # doctest: +SKIP
    >>> with skipping_clock() as clock:  # doctest: +SKIP
    ...     job.run(run_id="r")          # ctx.sleep(3600) inside returns at once
    ...     assert clock.slept == 3600

Child processes cannot share a skipping clock; give them a
:class:`~afk_local.clock.ScaledClock` instead (its ``env()`` goes in their
environment), on which time runs many times faster in every process alike.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

from afk_local.clock import ScaledClock, using_clock, wall_ns


class SkippingClock:
    """A wall clock that jumps forward instead of sleeping.

    Args:
        start: the time it starts at (seconds since the epoch; default: now).

    Attributes:
        slept: seconds skipped by :meth:`sleep` so far.
    """

    def __init__(self, start: float | None = None) -> None:
        self._now = wall_ns() / 1e9 if start is None else float(start)
        self._lock = threading.Lock()
        self.slept = 0.0

    def time(self) -> float:
        """The clock's current time."""
        with self._lock:
            return self._now

    def sleep(self, seconds: float) -> None:
        """Move the clock ``seconds`` forward at once (and let other threads run)."""
        if seconds > 0:
            with self._lock:
                self._now += seconds
                self.slept += seconds
        time.sleep(0)

    def advance(self, seconds: float) -> None:
        """Move the clock forward (time passing outside any wait, e.g. a laptop asleep)."""
        with self._lock:
            self._now += seconds

    def set(self, when: float) -> None:
        """Set the clock to ``when`` (also backwards: a clock change)."""
        with self._lock:
            self._now = float(when)

    def __repr__(self) -> str:
        return f"SkippingClock(time={self._now:.3f}, slept={self.slept:.3f})"


@contextlib.contextmanager
def skipping_clock(start: float | None = None) -> Iterator[SkippingClock]:
    """Install a :class:`SkippingClock` for the ``with`` block (the whole process)."""
    with using_clock(SkippingClock(start)) as clock:
        yield clock


__all__ = ["ScaledClock", "SkippingClock", "skipping_clock"]
