"""Killing this process at its N-th durable I/O call: the mechanism of every crash helper.

:func:`kill_at_io_call` installs an :class:`IoKillSwitch` as the I/O seam's hook
(:func:`afk_local.storage.fsio.set_io_hook`); :func:`afk_local.testing.run_and_kill` and
:func:`afk_local.testing.kill_sweep` install it in their child processes.
"""

from __future__ import annotations

import os
import signal
import sys

from afk_local.storage import fsio

EXIT_PAUSED = 3
"""The child's exit code when the job paused."""
EXIT_SLEEPING = 4
"""The child's exit code when the job parked in a long ``ctx.sleep``."""


class IoKillSwitch:
    """Counts durable I/O calls and SIGKILLs this process at the chosen one.

    Installed by :func:`kill_at_io_call`; :attr:`calls` tells a script that ran to
    the end how many calls there were (the range of kill points worth sweeping).
    """

    def __init__(self, at: int | None, operation: str = "io") -> None:
        self.at = at
        self.operation = operation
        self.calls = 0

    def __call__(self, operation: str, path: str) -> None:
        if self.operation not in ("io", operation):
            return
        self.calls += 1
        if self.calls == self.at:
            sys.stderr.write(f"afk-testing: killing at {operation} #{self.calls} ({path})\n")
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)


def kill_at_io_call(at: int | None, operation: str = "io") -> IoKillSwitch:
    """SIGKILL this process at its ``at``-th durable I/O call (``None``/0: only count).

    For crash tests run in a child process: every write-side call of afk_local
    (open, write, fsync, rename, symlink, link, unlink, truncate, mkdir) goes through
    :mod:`afk_local.storage.fsio`, so sweeping ``at`` over 1..N crashes a scripted run at
    every durable step it takes. ``operation`` counts only one kind of call.

    Example:
        >>> switch = kill_at_io_call(None)   # count only
        >>> switch.calls
        0
        >>> _ = fsio.set_io_hook(None)
    """
    switch = IoKillSwitch(at or None, operation)
    fsio.set_io_hook(switch)
    return switch


__all__ = ["EXIT_PAUSED", "EXIT_SLEEPING", "IoKillSwitch", "kill_at_io_call"]
