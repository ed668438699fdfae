"""The ``afk-local`` command line run in this process: ``main(argv)`` with captured output.

For tests whose point is a command's output and exit code, not a process boundary: no
interpreter start and no afk_local import per call (about 0.2 s of CPU each). The tests
of a crash, a lock held by another process, a signal or the installed entry point keep
spawning the real command.
"""

from __future__ import annotations

import io
import os
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, redirect_stderr, redirect_stdout

from afk_local.cli import main


@contextmanager
def environ(changes: Mapping[str, str | None]) -> Iterator[None]:
    """``os.environ`` with ``changes`` (``None`` removes a name), restored afterwards."""
    saved = {name: os.environ.get(name) for name in changes}
    try:
        for name, value in changes.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def run_cli(
    argv: Sequence[str], env: Mapping[str, str | None] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``afk-local argv...`` in this process; returns what a subprocess run would.

    ``env`` changes the environment for the call only; ``AFK_LOCAL_ROOT`` is unset unless
    ``env`` sets it (as the subprocess helpers do). argparse's exits become exit codes.
    """
    out, err = io.StringIO(), io.StringIO()
    changes: dict[str, str | None] = {"AFK_LOCAL_ROOT": None, **(env or {})}
    with environ(changes), redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse: --help, usage errors
            code = exc.code if isinstance(exc.code, int) else 2
    return subprocess.CompletedProcess(["afk-local", *argv], code, out.getvalue(), err.getvalue())
