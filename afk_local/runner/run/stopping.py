"""What SIGTERM and Ctrl-C do to a running job: exit cleanly, never in the middle of a step.

:func:`sigterm_exits` turns SIGTERM, and the first Ctrl-C (SIGINT), into
:class:`StopRequested` (a ``SystemExit``) while a job runs in the main thread, so
queued checkpoints flush on the way out; :func:`defer_stop` wraps a journaled call
so that exit waits until the call's outcome is journaled. A run stopped this way
(the watcher stopping, a person pressing Ctrl-C) leaves no effect in doubt and exits
with 128 + the signal's number (130 for Ctrl-C, 143 for SIGTERM), without a
traceback. A second Ctrl-C while a step runs stops at once: that step may be left
in doubt.

``async def`` jobs get the same through :func:`loop_stops`: the event loop takes the
signals (``loop.add_signal_handler``), a stop with no step in flight cancels the
job's task and comes out as :class:`StopRequested`, and ``ctx.astep`` raises a stop
deferred while its step ran as soon as the step's outcome is journaled.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import threading
from collections.abc import Iterator

log = logging.getLogger("afk_local")


class StopRequested(SystemExit):
    """A job's process was asked to stop (SIGTERM, Ctrl-C): the run is stopped, not failed.

    ``signum`` is the signal; ``at_once``: a second Ctrl-C did not wait for the
    running step (it may be in doubt). Exits the process with ``128 + signum``.
    """

    def __init__(self, signum: int, *, at_once: bool = False) -> None:
        super().__init__(128 + signum)
        self.signum = signum
        self.at_once = at_once


def stopped_line(run_id: str, exc: BaseException) -> str | None:
    """The one line that says a run was stopped by Ctrl-C (None for any other exception)."""
    if not isinstance(exc, StopRequested) or exc.signum != signal.SIGINT:
        return None
    how = (
        "at once by a second Ctrl-C: the step that was running may be in doubt"
        if exc.at_once
        else "by Ctrl-C, after its running step finished and was checkpointed"
    )
    return f"run {run_id} stopped {how}; continue it with `afk-local resume {run_id}`"


_stop_deferral = [0, 0]
"""[steps in flight, SIGTERM received meanwhile (0 = none)]: see :func:`sigterm_exits`."""
_stop_lock = threading.Lock()  # for the counter's writers; the signal handler only reads it


@contextlib.contextmanager
def defer_stop() -> Iterator[None]:
    """Wrap a journaled call: a SIGTERM under :func:`sigterm_exits` waits for the block to end.

    Used around ``ctx.step`` and the agent's LLM and tool calls, so a process
    stopped by SIGTERM (the watcher stopping) journals the call's outcome before
    it exits and leaves nothing in doubt. Any thread may enter (agent tools run in
    worker threads); the deferred ``SystemExit`` is raised when the main thread
    leaves such a block and none is left open.
    """
    with _stop_lock:
        _stop_deferral[0] += 1
    try:
        yield
    finally:
        with _stop_lock:
            _stop_deferral[0] -= 1
    raise_deferred_stop()


def raise_deferred_stop() -> None:
    """Raise the SystemExit a SIGTERM asked for while a step ran (main thread, no step left).

    ``ctx.astep`` calls it when its step's thread returns: in an async job the step
    ran in a worker thread, whose :func:`defer_stop` cannot raise in the main one.
    """
    signum = _stop_deferral[1]
    if signum and _stop_deferral[0] == 0 and threading.current_thread() is threading.main_thread():
        _stop_deferral[1] = 0
        raise StopRequested(signum)


def _stop(signum: int, frame: object) -> None:
    if _stop_deferral[0] > 0:  # inside ctx.step: stop right after its outcome is journaled
        if signum == signal.SIGINT and _stop_deferral[1] == signal.SIGINT:
            _stop_deferral[1] = 0  # the second Ctrl-C: the person will not wait
            raise StopRequested(signum, at_once=True)
        if not _stop_deferral[1]:
            _stop_deferral[1] = signum
        return
    raise StopRequested(signum)


@contextlib.contextmanager
def sigterm_exits() -> Iterator[None]:
    """While a job runs in the main thread, SIGTERM and Ctrl-C raise :class:`StopRequested`.

    Inside ``ctx.step`` the exit waits until the step's outcome is journaled, so a
    run stopped this way leaves no effect in doubt; a second Ctrl-C meanwhile stops
    at once. A handler the program installed itself is left alone.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    installed: list[tuple[int, signal._HANDLER]] = []
    for signum, default in (
        (signal.SIGTERM, signal.SIG_DFL),
        (signal.SIGINT, signal.default_int_handler),
    ):
        try:
            previous = signal.getsignal(signum)
        except (ValueError, AttributeError):  # pragma: no cover - no such signal here
            continue
        if previous is default:
            signal.signal(signum, _stop)
            installed.append((signum, previous))
    try:
        yield
    finally:
        for number, handler in installed:
            signal.signal(number, handler)
        _stop_deferral[1] = 0


class LoopStop:
    """What :func:`loop_stops` saw: the signal that stopped an async job's task, if any."""

    def __init__(self, task: asyncio.Task[object] | None) -> None:
        self._task = task
        self.signum = 0
        self.at_once = False

    def signalled(self, signum: int) -> None:
        """The loop's handler: defer while a step is in flight, else cancel the job's task."""
        if _stop_deferral[0] > 0:  # a step runs in a worker thread: wait for its outcome
            if signum == signal.SIGINT and _stop_deferral[1] == signal.SIGINT:
                _stop_deferral[1] = 0  # the second Ctrl-C: the person will not wait
                self._cancel(signum, at_once=True)
            elif not _stop_deferral[1]:
                _stop_deferral[1] = signum  # ctx.astep raises it once the step is journaled
            return
        self._cancel(signum, at_once=False)

    def _cancel(self, signum: int, *, at_once: bool) -> None:
        if self._task is not None and not self.signum:
            self.signum, self.at_once = signum, at_once
            self._task.cancel()

    def translate(self, exc: BaseException) -> BaseException:
        """The :class:`StopRequested` a cancellation caused by a signal stands for, else ``exc``."""
        if self.signum and isinstance(exc, asyncio.CancelledError):
            return StopRequested(self.signum, at_once=self.at_once)
        return exc


def _replaceable(signum: int, handler: object) -> bool:
    """True for the default handler, and for asyncio.run's own Ctrl-C handler."""
    if signum == signal.SIGTERM:
        return handler is signal.SIG_DFL
    if handler is signal.default_int_handler:
        return True
    func = handler.func if isinstance(handler, functools.partial) else handler
    runner = getattr(asyncio, "Runner", None)  # Python 3.11+: asyncio.run installs its own
    return runner is not None and isinstance(getattr(func, "__self__", None), runner)


@contextlib.contextmanager
def loop_stops() -> Iterator[LoopStop]:
    """The async twin of :func:`sigterm_exits`, for the task running an ``async def`` job.

    In the main thread's event loop, SIGTERM and Ctrl-C are taken by the loop: with no
    step in flight they cancel the current task (:meth:`LoopStop.translate` turns that
    cancellation into :class:`StopRequested`); during ``ctx.astep`` the stop waits for
    the step's outcome, and a second Ctrl-C cancels at once. Handlers the program
    installed itself are left alone; the previous ones come back on exit.
    """
    task = asyncio.current_task()
    stop = LoopStop(task)
    if task is None or threading.current_thread() is not threading.main_thread():
        yield stop
        return
    loop = asyncio.get_running_loop()
    installed: list[tuple[int, signal._HANDLER]] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(signum)
        if _replaceable(signum, previous):
            try:
                loop.add_signal_handler(signum, stop.signalled, signum)
            except (NotImplementedError, RuntimeError):  # pragma: no cover - not a Unix loop
                continue
            installed.append((signum, previous))
    try:
        yield stop
    finally:
        for number, handler in installed:
            loop.remove_signal_handler(number)
            signal.signal(number, handler)
        _stop_deferral[1] = 0


__all__ = [
    "LoopStop",
    "StopRequested",
    "defer_stop",
    "loop_stops",
    "raise_deferred_stop",
    "sigterm_exits",
    "stopped_line",
]
