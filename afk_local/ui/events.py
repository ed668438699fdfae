"""Which runs changed, pushed to the open pages: one watchfiles watch of ``runs/``, shared.

:class:`RunChanges` watches the store's ``runs/`` directory (recursively: a run's
``run.meta`` and checkpoints live in its own directory) with watchfiles while at
least one page listens, debounced, and hands every listener the ids of the runs
that changed. One watch serves every open page, so ten tabs cost one set of
inotify watches, not ten. :meth:`RunChanges.close` (the server stopping) ends
every listener at once, so an open event stream never holds up the shutdown.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import watchfiles

log = logging.getLogger("afk_local")

DEBOUNCE_MS = 200
"""Changes within this many milliseconds are pushed as one event."""
HEARTBEAT_S = 15.0
"""A listener with nothing to say is woken this often (the stream sends a comment)."""
READY_CHECK_MS = 100
"""How long the watch waits for a change before it reports that it is in place: watchfiles
yields on that timeout only once its watches are set up, and a listener's first answer
waits for it (so "listening" is never said before a change would be seen)."""
MAX_NAMED_RUNS = 1000
"""More changed runs than this between two events are pushed as "everything changed"."""

EVERYTHING: frozenset[str] = frozenset()
"""What a listener gets when too many runs changed to name them (or for a heartbeat: see
:meth:`RunChanges.listen`)."""


class _Listener:
    """One open page: the runs changed since it was last woken, and its wake-up."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.wake = asyncio.Event()
        self.changed: set[str] = set()
        self.overflow = False

    def add(self, run_ids: set[str]) -> None:
        if not self.overflow:
            self.changed |= run_ids
            if len(self.changed) > MAX_NAMED_RUNS:
                self.changed.clear()
                self.overflow = True
        self.wake.set()

    def take(self) -> tuple[frozenset[str], bool]:
        taken, overflow = frozenset(self.changed), self.overflow
        self.changed.clear()
        self.overflow = False
        self.wake.clear()
        return taken, overflow


class RunChanges:
    """The changed runs of one store, for any number of listeners (one watch for all)."""

    def __init__(self, runs_dir: Path, *, debounce_ms: int = DEBOUNCE_MS) -> None:
        self.runs_dir = runs_dir
        self.debounce_ms = debounce_ms
        self._listeners: set[_Listener] = set()
        self._task: asyncio.Task[None] | None = None
        self._stop_watch: threading.Event | None = None
        self._ready: asyncio.Event | None = None  # set once the current watch is in place
        self._closed = threading.Event()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called: listeners end, new ones end at once."""
        return self._closed.is_set()

    def close(self) -> None:
        """End every listener and the watch (safe from a signal handler or another thread)."""
        self._closed.set()
        if self._stop_watch is not None:
            self._stop_watch.set()
        for listener in list(self._listeners):
            listener.loop.call_soon_threadsafe(listener.wake.set)

    async def listen(self) -> AsyncIterator[frozenset[str] | None]:
        """Yield the ids of the runs that changed, as they change, until :meth:`close`.

        Yields ``None`` first once the watch is in place: no change made after that is
        missed (an earlier one may be; a page read before it should read again). Then
        ``None`` when nothing changed for :data:`HEARTBEAT_S` seconds, and
        :data:`EVERYTHING` (empty) when too many runs changed to name them.
        """
        listener = _Listener(asyncio.get_running_loop())
        self._listeners.add(listener)
        ready = self._start_watch()
        try:
            if ready is not None and not self.closed:
                await _first_of(ready, listener.wake, HEARTBEAT_S)  # a failed watch: no wait
            if self.closed:
                return
            yield None  # listening
            while not self.closed:
                try:
                    await asyncio.wait_for(listener.wake.wait(), HEARTBEAT_S)
                except asyncio.TimeoutError:
                    yield None
                    continue
                if self.closed:
                    break
                changed, overflow = listener.take()
                yield EVERYTHING if overflow else changed
        finally:
            self._listeners.discard(listener)
            if not self._listeners:
                self._stop()

    def _start_watch(self) -> asyncio.Event | None:
        """Start the shared watch if none runs; returns the event set once it is in place."""
        if self._task is None and not self.closed:
            self._stop_watch, self._ready = threading.Event(), asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(
                self._watch(self._stop_watch, self._ready)
            )
        return self._ready

    def _stop(self) -> None:
        if self._stop_watch is not None:
            self._stop_watch.set()  # the watch's thread sees it within its step (50 ms)
        self._task, self._stop_watch, self._ready = None, None, None

    async def _watch(self, stop: threading.Event, ready: asyncio.Event) -> None:
        runs = self.runs_dir.resolve()
        try:
            runs.mkdir(parents=True, exist_ok=True, mode=0o700)
            async for changes in watchfiles.awatch(
                runs,
                watch_filter=None,
                debounce=self.debounce_ms,
                step=50,
                stop_event=stop,
                rust_timeout=READY_CHECK_MS,
                yield_on_timeout=True,  # the first yield: the watches are set up
            ):
                ready.set()
                run_ids = {_run_of(runs, path) for _, path in changes}
                run_ids.discard("")
                if run_ids:
                    for listener in list(self._listeners):
                        listener.add(run_ids)
        except Exception as exc:  # a page then only shows changes when reloaded
            log.warning("ui: watching %s for changes failed: %s", runs, exc)
        finally:
            ready.set()  # no listener waits for a watch that ended


async def _first_of(first: asyncio.Event, second: asyncio.Event, timeout: float) -> None:
    """Return once either event is set, or after ``timeout`` seconds."""
    waits = [asyncio.ensure_future(first.wait()), asyncio.ensure_future(second.wait())]
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


def _run_of(runs: Path, path: str) -> str:
    """The run id a changed path is under (``runs/<id>/...``); "" for none (a temporary)."""
    try:
        first = Path(path).relative_to(runs).parts[0]
    except (ValueError, IndexError):
        return ""
    return "" if first.startswith(".") else first


__all__ = ["DEBOUNCE_MS", "EVERYTHING", "HEARTBEAT_S", "MAX_NAMED_RUNS", "RunChanges"]
