"""How a plain script ends when its job parks, pauses or is refused: one line, not a traceback.

A script that calls ``job.run(...)`` and lets :class:`~afk_local.RunPaused` or
:class:`~afk_local.RunSleeping` reach the top did nothing wrong: the run waits, and
someone (a person, the watcher) continues it. Python would print a traceback and
exit 1, which reads as a crash to a person and to cron alike. The first entry that can
continue a run installs :func:`script_excepthook` (only over Python's own hook, never
over one an application or IPython set), which prints the error's one line instead
and exits with a status that says what happened (docs/runner.md, "Exit status of a
script"):

- ``3`` (:data:`EXIT_PAUSED`): the run is paused waiting for input;
- ``4`` (:data:`EXIT_SLEEPING`): the run is parked until a time, the watcher wakes it;
- ``1``: refused before anything ran (the store was copied or moved, is read-only, or
  is not trusted), in one line that says what to do.

Every other exception keeps Python's traceback. An exception the script catches is
never seen here: the hook only sees what ends the process.
"""

from __future__ import annotations

import sys
from types import TracebackType

from afk_local.errors import RunPaused, RunSleeping, StoreUnusableError, UntrustedStoreError

EXIT_PAUSED = 3
"""A script's exit status when its job paused waiting for input."""
EXIT_SLEEPING = 4
"""A script's exit status when its job parked in a long sleep."""
EXIT_REFUSED = 1
"""A script's exit status when its run was refused before anything ran."""

_ONE_LINE = (RunPaused, RunSleeping, UntrustedStoreError, StoreUnusableError)


def exit_status(error: BaseException) -> int | None:
    """The status a script ends with when ``error`` reaches its top; None: a traceback."""
    if isinstance(error, RunPaused):
        return EXIT_PAUSED
    if isinstance(error, RunSleeping):
        return EXIT_SLEEPING
    if isinstance(error, _ONE_LINE):
        return EXIT_REFUSED
    return None


def script_excepthook(
    kind: type[BaseException], error: BaseException, tb: TracebackType | None
) -> None:
    """``sys.excepthook`` for scripts: afk_local's waits and refusals as one line."""
    status = exit_status(error)
    if status is None:
        sys.__excepthook__(kind, error, tb)
        return
    sys.stderr.write(f"{kind.__name__}: {error}\n")
    sys.stderr.flush()
    raise SystemExit(status)  # raised from the hook: Python exits with it, atexit still runs


def install_script_excepthook() -> None:
    """Install :func:`script_excepthook` unless someone else's hook is in place."""
    if sys.excepthook is sys.__excepthook__:
        sys.excepthook = script_excepthook


__all__ = [
    "EXIT_PAUSED",
    "EXIT_REFUSED",
    "EXIT_SLEEPING",
    "exit_status",
    "install_script_excepthook",
    "script_excepthook",
]
