"""Shared limits: :class:`Limit` keeps every process using a store under N at once and M a minute.

A limit lives in the store, no server: ``<root>/limits/<name>/``

- ``slot-<i>.lock`` (``i < concurrent``): a step runs while it holds one of these
  file locks. The kernel drops a lock with its process, so a holder killed with
  SIGKILL never leaks its slot.
- ``starts`` with ``starts.lock``: the clock times of the starts of the last 60 s,
  rewritten atomically under the lock; a step starts only while fewer than
  ``per_minute`` are younger than 60 s. A started step counts even if it dies.

Waiting uses :func:`afk_local.clock.current_clock`, so a time-skipping
clock skips it too.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from afk_local.clock import current_clock
from afk_local.errors import InvalidRunIdError
from afk_local.storage import fsio
from afk_local.storage.format.layout import validate_run_id

if TYPE_CHECKING:
    from filelock import FileLock

log = logging.getLogger("afk_local")

LIMITS_DIR = "limits"
WINDOW_S = 60.0
_POLL_S = 0.2  # clock seconds between two looks at a busy limit
_MAX_STARTS_BYTES = 1 << 20  # the starts file holds at most per_minute floats

_starts_type = msgspec.msgpack.Decoder(list[float])


@dataclass(frozen=True)
class Limit:
    """A limit shared by every process on the machine that uses the store.

    Args:
        name: the limit's name (same characters as a run id); steps passing
            limits of one name share them.
        concurrent: at most this many steps under the limit run at once.
        per_minute: at most this many start in any 60 s window.

    Example:
        >>> api = afk.Limit("openai", concurrent=2, per_minute=30)  # doctest: +SKIP
        >>> ctx.step("ask", ask, prompt, limit=api)  # doctest: +SKIP
    """

    name: str
    concurrent: int | None = None
    per_minute: int | None = None

    def __post_init__(self) -> None:
        try:
            validate_run_id(self.name)
        except InvalidRunIdError:
            raise ValueError(
                f"Limit name {self.name!r}: use letters, digits, '.', '_' and '-' (it names "
                "a directory in the store)"
            ) from None
        for what in ("concurrent", "per_minute"):
            value = getattr(self, what)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"Limit.{what} must be an int >= 1 or None, not {value!r}")
        if self.concurrent is None and self.per_minute is None:
            raise ValueError(f"Limit {self.name!r}: give concurrent=, per_minute= or both")


Waiting = Callable[[str | None], None]
"""Told ``"slot"`` or ``"rate"`` when a step starts waiting, None when it got through."""


@contextlib.contextmanager
def limited(root: Path, limit: Limit, on_wait: Waiting | None = None) -> Iterator[float]:
    """Hold a place under ``limit`` (a slot and a start) for the ``with`` block.

    Yields the clock time the start was counted at (when the place was taken).
    """
    directory = root / LIMITS_DIR / limit.name
    fsio.make_dirs(directory)
    waited = False

    def waiting(what: str) -> None:
        nonlocal waited
        if not waited and on_wait is not None:
            on_wait(what)
        waited = True

    slot = _take_slot(directory, limit.concurrent, waiting) if limit.concurrent else None
    try:
        started = current_clock().time()
        if limit.per_minute:
            started = _take_start(directory, limit.per_minute, waiting)
        if waited and on_wait is not None:
            on_wait(None)
        yield started
    finally:
        if slot is not None:
            slot.release()


def file_lock(path: Path, timeout: float) -> FileLock:
    """A ``filelock`` on ``path`` as the store makes them (0600, never followed, kernel-held).

    ``timeout`` as in filelock (-1: wait for ever). A symlink or other non-file there
    raises OSError: it is no lock afk_local made.
    """
    from filelock import FileLock  # noqa: PLC0415 - as in storage.rundir.ownership

    problem = fsio.regular_file_problem(path)
    if problem is not None:
        raise OSError(f"{path}: {problem}; remove it (it is no lock afk_local made)")
    return FileLock(
        str(path),
        timeout=timeout,
        mode=fsio.FILE_MODE,
        thread_local=False,
        fallback_to_soft=False,
        preserve_lock_file=True,
    )


def _take_slot(directory: Path, concurrent: int, waiting: Callable[[str], None]) -> FileLock:
    from filelock import Timeout  # noqa: PLC0415

    clock = current_clock()
    first = os.getpid() % concurrent  # spread the first tries over the slots
    while True:
        for i in range(concurrent):
            lock = file_lock(directory / f"slot-{(first + i) % concurrent}.lock", 0)
            try:
                lock.acquire(timeout=0)
            except Timeout:
                continue
            return lock
        waiting("slot")
        clock.sleep(_POLL_S)


def _take_start(directory: Path, per_minute: int, waiting: Callable[[str], None]) -> float:
    clock = current_clock()
    path = directory / "starts"
    while True:
        with file_lock(directory / "starts.lock", -1):
            now = clock.time()
            starts = [t for t in _read_starts(path) if now - WINDOW_S < t <= now + WINDOW_S]
            if len(starts) < per_minute:
                starts.append(now)
                fsio.atomic_write(path, msgspec.msgpack.encode(sorted(starts)[-per_minute:]))
                return now
            free_at = min(starts) + WINDOW_S
        waiting("rate")
        clock.sleep(min(max(free_at - clock.time(), 0.0) + 0.001, WINDOW_S))


def _read_starts(path: Path) -> list[float]:
    try:
        data = fsio.read_bounded(path, _MAX_STARTS_BYTES)
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        log.warning("limit file %s unreadable (%s): starting a new window", path, exc)
        return []
    try:
        return _starts_type.decode(data)
    except msgspec.DecodeError as exc:
        log.warning("limit file %s damaged (%s): starting a new window", path, exc)
        return []


__all__ = ["LIMITS_DIR", "WINDOW_S", "Limit", "Waiting", "file_lock", "limited"]
