"""The store operations of SIGKILL segments, run as a user runs them: ``afk-local`` in a
child process, killed before a chosen durable I/O call.

The child is ``python -c`` with :func:`afk_local.testing.kill_at_io_call` installed
before the command line's ``main`` runs, so ``gc``, ``pack``, ``rm``, ``fork``,
``import`` and ``verify`` die mid-write as an OOM kill would leave them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from afk_local.testing.forkserver import run_python

_CHILD = (
    "import sys; from afk_local.testing import kill_at_io_call; "
    "kill_at_io_call(int(sys.argv[1]) or None); "
    "from afk_local.cli import main; raise SystemExit(main(sys.argv[2:]))"
)


@dataclass(frozen=True)
class CommandResult:
    """What one ``afk-local`` child did."""

    killed: bool
    returncode: int
    stdout: str
    stderr: str


def afk_local_command(
    root: Path, args: list[str], *, kill_at: int | None, timeout: float = 120.0
) -> CommandResult:
    """Run ``afk-local ARGS`` on the store at ``root`` in a child; SIGKILL it before its
    ``kill_at``-th durable I/O call (None: let it finish)."""
    env = dict(os.environ)
    env["AFK_LOCAL_ROOT"] = str(root)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    proc = run_python(_CHILD, [str(kill_at or 0), *args], env=env, timeout=timeout)
    killed = proc.returncode == -signal.SIGKILL and "afk-testing: killing" in proc.stderr
    return CommandResult(killed, proc.returncode, proc.stdout, proc.stderr)


@contextlib.contextmanager
def child_environ(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables for the children started inside (run_and_kill passes
    this process's environment on), and restore them after."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


__all__ = ["CommandResult", "afk_local_command", "child_environ"]
