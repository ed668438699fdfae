"""What SIGTERM does to a running job: exit cleanly, but never in the middle of a step.

:func:`sigterm_exits` turns SIGTERM into ``SystemExit`` while a job runs in the
main thread, so queued checkpoints flush on the way out; :func:`defer_stop`
wraps a journaled call so that exit waits until the call's outcome is
journaled. A run stopped by SIGTERM (the watcher stopping) leaves no effect in
doubt.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

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
    _raise_deferred_stop()


def _raise_deferred_stop() -> None:
    """Raise the SystemExit a SIGTERM asked for while a step ran (main thread, no step left)."""
    signum = _stop_deferral[1]
    if signum and _stop_deferral[0] == 0 and threading.current_thread() is threading.main_thread():
        _stop_deferral[1] = 0
        raise SystemExit(128 + signum)


@contextlib.contextmanager
def sigterm_exits() -> Iterator[None]:
    """While a job runs in the main thread, SIGTERM raises SystemExit: queued checkpoints flush.

    Inside ``ctx.step`` the exit waits until the step's outcome is journaled, so
    a run stopped by SIGTERM (the watcher stopping) leaves no effect in doubt.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    try:
        previous = signal.getsignal(signal.SIGTERM)
    except (ValueError, AttributeError):  # pragma: no cover - no SIGTERM here
        yield
        return
    if previous is not signal.SIG_DFL:
        yield
        return

    def stop(signum: int, frame: object) -> None:
        if _stop_deferral[0] > 0:  # inside ctx.step: stop right after its outcome is journaled
            _stop_deferral[1] = signum
            return
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        _stop_deferral[1] = 0


__all__ = ["defer_stop", "sigterm_exits"]
