"""Spawning and killing real child processes for crash tests.

A child started by :func:`spawn` runs ``python -c SCRIPT`` and prints one line per
acknowledged operation; the parent reads those lines and SIGKILLs the child at a
moment of its choosing, so a crash lands wherever the child happens to be.

Every ``python -c`` or ``python -m afk_local`` child these helpers start (:func:`spawn`,
:func:`start`, :func:`run`, :func:`python`, :func:`afk_local_cli`,
:class:`JsonLinesChild`) is a fresh fork of the worker's fork server
(``afk_local.testing.forkserver``, activated for every test by conftest.py) unless the
test is marked ``fresh_interpreter``: a real process with the same code, arguments,
environment, directory and ``sys.path``, which does not pay for the interpreter's
start-up and afk_local's imports (about 0.3 s of CPU a child). Children those children
start (the jobs a watcher runs) are new interpreters.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from afk_local.testing.forkserver import popen_python, run_python


def spawn(script: str, *args: str, env: dict[str, str] | None = None):
    """Start ``python -c script args...`` (this environment updated with ``env``) with
    stdout and stderr as text pipes; a ``subprocess.Popen`` or a forked child with the
    same methods."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    return popen_python(textwrap.dedent(script), args, env=full_env)


def run(script: str, *args: str, env: dict[str, str] | None = None, timeout: float = 120):
    """Run ``python -c script args...`` (this environment updated with ``env``) to its
    end; returns the CompletedProcess (never raises on exit code)."""
    full_env = {**os.environ, **(env or {})}
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    return run_python(textwrap.dedent(script), args, env=full_env, timeout=timeout)


CLI = "from afk_local.cli import main; raise SystemExit(main())"
"""``python -m afk_local`` as ``python -c`` code (``main`` reads ``sys.argv[1:]``)."""


def python(
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    timeout: float = 120,
    cwd: str | os.PathLike[str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python -m afk_local ARGS...`` or ``python -c CODE ARGS...`` with exactly ``env``
    (in ``cwd``) to its end, output captured as text; what ``subprocess.run(...,
    capture_output=True, text=True)`` returns (never raises on exit code)."""
    code, rest = _code_and_args(args)
    return run_python(code, rest, env=env, timeout=timeout, cwd=cwd)


def start(command: Sequence[str], *, env: Mapping[str, str], cwd=None):
    """Start ``command`` with exactly ``env``, stdout and stderr text pipes: ``python -m
    afk_local ...`` and ``python -c ...`` through the fork server (module docstring),
    anything else with ``subprocess.Popen``."""
    if command[0] == sys.executable and command[1:2] in (["-m"], ["-c"]):
        code, rest = _code_and_args(command[1:])
        return popen_python(code, rest, env=env, cwd=cwd)
    return subprocess.Popen(
        list(command),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(env),
        cwd=cwd,
    )


def _code_and_args(args: Sequence[str]) -> tuple[str, list[str]]:
    match list(args):
        case ["-m", "afk_local", *rest]:
            return CLI, rest
        case ["-c", code, *rest]:
            return code, rest
    raise ValueError(f"python -m afk_local or python -c, not {args}")


@dataclass
class Killed:
    """What a child said before it was killed."""

    lines: list[str] = field(default_factory=list)
    returncode: int | None = None
    stderr: str = ""


def kill_after(
    proc: subprocess.Popen[str], *, acks: int | None = None, seconds: float | None = None
) -> Killed:
    """SIGKILL ``proc`` after it printed ``acks`` lines or ``seconds`` passed (first wins).

    Lines printed before the kill are returned; a child that exits on its own
    is simply collected.
    """
    assert proc.stdout is not None
    result = Killed()
    deadline = time.monotonic() + (seconds if seconds is not None else 120)
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    buffer = ""
    fd = proc.stdout.fileno()
    try:
        while True:
            if acks is not None and len(result.lines) >= acks:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if not selector.select(timeout=min(remaining, 0.05)):
                if proc.poll() is not None:
                    # drain what is left
                    rest = os.read(fd, 1 << 20).decode()
                    buffer += rest
                    if not rest:
                        break
                continue
            chunk = os.read(fd, 65536).decode()
            if not chunk:
                break
            buffer += chunk
            *complete, buffer = buffer.split("\n")
            result.lines.extend(line for line in complete if line)
    finally:
        selector.close()
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait()
    # Lines that were fully written before the kill still count as acknowledged.
    rest = proc.stdout.read()
    buffer += rest
    *complete, _partial = buffer.split("\n")
    result.lines.extend(line for line in complete if line)
    result.returncode = proc.returncode
    result.stderr = proc.stderr.read() if proc.stderr else ""
    return result


class JsonLinesChild:
    """A long-running child (e.g. ``afk-local watch --json``) whose JSON lines are collected.

    Use as a context manager; a child still running at exit is killed.
    """

    def __init__(self, cmd: list[str], env: dict[str, str]) -> None:
        self.events: list[dict] = []
        self.proc = start(cmd, env=env)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.events.append(json.loads(line))

    def wait_for(self, predicate, timeout: float = 60.0) -> None:
        """Poll ``predicate()`` until true; fail if the child exits or time runs out."""
        deadline = time.monotonic() + timeout
        while not predicate():
            assert self.proc.poll() is None, f"child exited: {self.proc.stderr.read()}"
            assert time.monotonic() < deadline, f"timed out; events: {self.events}"
            time.sleep(0.05)

    def stop(self) -> int:
        """SIGTERM the child (if still running) and return its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=60)
        self._thread.join(timeout=10)
        return code

    def __enter__(self) -> JsonLinesChild:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


SUPPORT = Path(__file__).resolve().parent
"""tests/support: the job modules every child imports (put on its PYTHONPATH)."""
REPO = SUPPORT.parent.parent
"""The repository checkout (README, examples/, benchmarks/)."""


def kill_at_line(child: subprocess.Popen[str], marker: str, *, timeout: float = 120) -> list[str]:
    """SIGKILL ``child`` once it printed the line ``marker`` (it should stall there);
    returns the lines it printed. The kill must be the child's end: a child that exited
    by itself, or printed no such line within ``timeout`` seconds, fails the test."""
    watchdog = threading.Timer(timeout, child.kill)
    watchdog.start()
    lines: list[str] = []
    try:
        assert child.stdout is not None
        for line in child.stdout:
            lines.append(line.rstrip("\n"))
            if lines[-1] == marker:
                child.send_signal(signal.SIGKILL)
                break
    finally:
        watchdog.cancel()
    child.wait()
    stderr = child.stderr.read() if child.stderr else ""
    assert child.returncode == -signal.SIGKILL, f"{lines}\n{stderr}"
    return lines


def afk_local_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m afk_local ARGS`` to its end with ``env`` over this environment."""
    return python(["-m", "afk_local", *args], env={**os.environ, **env})
