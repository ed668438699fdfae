"""The clock: the one seam for "now" and "wait" (docs/time.md, docs/options.md).

Every stored stamp (:func:`afk_local.storage.format.records.now_ms`) and all of
durable time (sleeps, retry backoffs, shared limits, the watcher's wake-ups and
schedules) ask :func:`current_clock` what time it is and how to wait, and
:meth:`SystemClock.time` is the one place afk_local reads the wall clock. A test
swaps in a time-skipping clock (:class:`afk_local.testing.SkippingClock`): a
one-hour sleep returns at once, and every record is stamped with the skipped time.
Durations (timeouts, lock waits) use monotonic timers, which are not the clock.

Time is the wall clock, not a monotonic one: a due time is a point on the calendar,
so the hours a laptop spent asleep or switched off count as waited.

Child processes (the watcher's resumes, a test's workers) pick up a scaled clock
from ``AFK_LOCAL_CLOCK=<scale>@<origin>`` (read here and nowhere else): time runs
``scale`` times faster than the wall clock from ``origin`` on, in every process
that shares the variable, so they agree on the time.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from typing import Protocol, TypeVar

CLOCK_ENV = "AFK_LOCAL_CLOCK"
"""``<scale>@<origin>``: every process with it runs on the same :class:`ScaledClock`;
``+<seconds>`` (or ``-<seconds>``): the wall clock shifted by that much
(:class:`ShiftedClock`, how a test's skipping clock reaches a watcher's children)."""

_SLICE_S = 1.0  # the longest real sleep between two readings of the wall clock


class Clock(Protocol):
    """Wall-clock time and waiting, as durable time sees them."""

    def time(self) -> float:
        """Seconds since the epoch (wall clock)."""
        ...

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of this clock's time."""
        ...


def wall_ns() -> int:
    """The wall clock in nanoseconds since the epoch: the one reading of it in afk_local."""
    return time.time_ns()


class SystemClock:
    """The real clock: the wall clock and ``time.sleep``."""

    def time(self) -> float:
        """Seconds since the epoch."""
        return wall_ns() / 1e9

    def sleep(self, seconds: float) -> None:
        """Block the thread until ``seconds`` of wall-clock time passed.

        It wakes at least every second to re-read the wall clock: ``time.sleep``
        does not count time the machine spent suspended, a calendar does.
        """
        due = self.time() + seconds
        while (left := due - self.time()) > 0:
            time.sleep(min(left, _SLICE_S))

    def __repr__(self) -> str:
        return "SystemClock()"


class ScaledClock:
    """A wall clock running ``scale`` times faster from ``origin`` on (shared by processes).

    ``time()`` is ``origin + (wall - origin) * scale``; ``sleep(s)`` waits
    ``s / scale`` real seconds. Every process built with the same ``scale`` and
    ``origin`` reads the same time, so waits that span processes stay consistent.
    """

    def __init__(self, scale: float, origin: float | None = None) -> None:
        if not scale > 0:
            raise ValueError(f"a clock scale must be > 0, not {scale!r}")
        self.scale = float(scale)
        self.origin = wall_ns() / 1e9 if origin is None else float(origin)

    def time(self) -> float:
        """The scaled time."""
        return self.origin + (wall_ns() / 1e9 - self.origin) * self.scale

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of scaled time."""
        due = self.time() + seconds
        while (left := due - self.time()) > 0:
            time.sleep(min(left / self.scale, _SLICE_S))

    def env(self) -> dict[str, str]:
        """The environment that gives a child process this same clock."""
        return {CLOCK_ENV: f"{self.scale!r}@{self.origin!r}"}

    def __repr__(self) -> str:
        return f"ScaledClock(scale={self.scale}, origin={self.origin})"


class ShiftedClock:
    """The wall clock shifted by ``offset`` seconds: real-speed time from another clock's now.

    A watcher hands its children the time of the clock it runs on
    (:func:`child_clock_env`): a test that advanced a skipping clock past a run's
    ``wake_at`` starts a child that agrees the wait is over.
    """

    def __init__(self, offset: float) -> None:
        self.offset = float(offset)

    def time(self) -> float:
        """The wall clock plus the offset."""
        return wall_ns() / 1e9 + self.offset

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` (real time: the offset does not change)."""
        SystemClock().sleep(seconds)

    def env(self) -> dict[str, str]:
        """The environment that gives a child process this same clock."""
        return {CLOCK_ENV: f"{self.offset:+.6f}"}

    def __repr__(self) -> str:
        return f"ShiftedClock(offset={self.offset})"


def child_clock_env() -> dict[str, str]:
    """The environment that gives a child process the time this process reads now.

    Nothing for the real clock. A clock with an ``env()`` (:class:`ScaledClock`,
    :class:`ShiftedClock`) gives its own; any other installed clock (a test's skipping
    clock) is passed on as the wall clock shifted to its current time.
    """
    clock = current_clock()
    if isinstance(clock, SystemClock):
        return {}
    env = getattr(clock, "env", None)
    if callable(env):
        given = env()
        if isinstance(given, dict):
            return {str(k): str(v) for k, v in given.items()}
    return ShiftedClock(clock.time() - wall_ns() / 1e9).env()


C = TypeVar("C", bound=Clock)


class _Installed:
    """The process's clock (None until first asked for: then from the environment)."""

    lock = threading.Lock()
    clock: Clock | None = None


def _from_env() -> Clock:
    value = os.environ.get(CLOCK_ENV, "").strip()
    if not value:
        return SystemClock()
    if value[0] in "+-":
        try:
            return ShiftedClock(float(value))
        except ValueError as exc:
            raise ValueError(f"${CLOCK_ENV}={value!r}: expected +<seconds> ({exc})") from None
    scale, _, origin = value.partition("@")
    try:
        return ScaledClock(float(scale), float(origin) if origin else None)
    except ValueError as exc:
        raise ValueError(f"${CLOCK_ENV}={value!r}: expected <scale>@<origin> ({exc})") from None


def current_clock() -> Clock:
    """The clock durable time uses now: the installed one, else ``$AFK_LOCAL_CLOCK``, else real."""
    clock = _Installed.clock  # read without the lock: every record stamp comes here
    if clock is not None:
        return clock
    with _Installed.lock:
        if _Installed.clock is None:
            _Installed.clock = _from_env()
        return _Installed.clock


def set_clock(clock: Clock | None) -> Clock | None:
    """Install ``clock`` for the whole process (None: back to the default); returns the previous."""
    with _Installed.lock:
        previous, _Installed.clock = _Installed.clock, clock
        return previous


@contextlib.contextmanager
def using_clock(clock: C) -> Iterator[C]:
    """Use ``clock`` inside the ``with`` block, then put the previous one back."""
    previous = set_clock(clock)
    try:
        yield clock
    finally:
        set_clock(previous)


def clock_ms() -> int:
    """The current clock's time in whole milliseconds (how records store time)."""
    clock = current_clock()
    if type(clock) is SystemClock:
        return wall_ns() // 1_000_000  # exact: no float on the common path
    return int(clock.time() * 1000)


__all__ = [
    "CLOCK_ENV",
    "Clock",
    "ScaledClock",
    "ShiftedClock",
    "SystemClock",
    "child_clock_env",
    "clock_ms",
    "current_clock",
    "set_clock",
    "using_clock",
    "wall_ns",
]
