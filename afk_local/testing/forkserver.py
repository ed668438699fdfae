"""Child processes without the interpreter's start-up: a pre-imported fork server.

A crash helper's child (:func:`afk_local.testing.run_and_kill`, the fuzzer's
``afk-local`` commands) is ``python -c CODE ARGS...``; most of its cost is starting
Python and importing afk_local (about 1 s of CPU on a slow machine), not the work it
was started for. Inside :func:`using_fork_server`, each such child is instead a fresh
``os.fork()`` of a *server*: a process started once, with ``python -c``, that imports
afk_local (the command line, the crash helpers, the fuzzer's jobs) and then only
waits for requests. It never opens a store, takes a lock, starts a writer or a thread,
or reads the clock for afk_local, so each child starts from a process that holds no
afk_local state but imported modules. The child is a real process: it runs ``CODE``
with ``sys.argv`` as ``python -c`` would give it, with the environment it was asked
for, its output in files the caller reads, and it ends as an interpreter ends (threads
joined, ``atexit`` handlers run) or is SIGKILLed where ``CODE`` kills it.

Outside :func:`using_fork_server`, :func:`run_python` starts a fresh interpreter, as
it always did. Where ``os.fork`` or ``os.pidfd_open`` does not exist (not Linux), the
server is not used.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

PRELOADED = ("afk_local.cli", "afk_local.testing", "afk_local.testing.fuzz.jobs")
"""Modules the server imports once, so no child pays for them."""

_SERVER = "from afk_local.testing.forkserver import _serve; _serve()"

_active: list[ForkServer | None] = [None]


class ForkServer:
    """A pre-imported process that forks one child per :meth:`run` (module docstring).

    Args:
        preload: modules to import in the server before the first fork.
    """

    def __init__(self, preload: Sequence[str] = PRELOADED) -> None:
        self._preload = tuple(preload)
        self._proc: subprocess.Popen[bytes] | None = None
        self._files = Path(tempfile.mkdtemp(prefix="afk-forkserver-"))
        self._lock = threading.Lock()
        self.children = 0
        """Children forked so far."""

    @property
    def pid(self) -> int:
        """The server's process id (it starts at its first child, or here)."""
        return self._started().pid

    def _started(self) -> subprocess.Popen[bytes]:
        if self._proc is None:
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _SERVER, *self._preload],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
            )
        return self._proc

    def run(
        self,
        code: str,
        args: Sequence[str],
        *,
        env: Mapping[str, str],
        timeout: float,
        cwd: str | os.PathLike[str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``python -c code args...`` as a fresh fork of the server, in ``cwd`` (default:
        this process's directory); returns what ``subprocess.run(..., capture_output=True,
        text=True)`` would.

        Raises:
            subprocess.TimeoutExpired: the child ran longer than ``timeout`` (it is killed).
        """
        with self._lock:
            self.children += 1
            out, err = self._files / "stdout", self._files / "stderr"
            request = {
                "code": code,
                "args": list(args),
                "env": dict(env),
                "cwd": os.fspath(cwd) if cwd is not None else os.getcwd(),
                "timeout": timeout,
                "stdout": str(out),
                "stderr": str(err),
            }
            stdin, stdout = self._pipes()
            stdin.write(json.dumps(request).encode() + b"\n")
            stdin.flush()
            line = stdout.readline()
            if not line:
                raise RuntimeError(f"the fork server (pid {self.pid}) died")
            reply = json.loads(line)
            argv = [sys.executable, "-c", code, *args]
            text_out = out.read_text(encoding="utf-8", errors="replace")
            text_err = err.read_text(encoding="utf-8", errors="replace")
            if reply["timed_out"]:
                raise subprocess.TimeoutExpired(argv, timeout, text_out, text_err)
            return subprocess.CompletedProcess(argv, reply["returncode"], text_out, text_err)

    def _pipes(self) -> tuple[IO[bytes], IO[bytes]]:
        proc = self._started()
        stdin, stdout = proc.stdin, proc.stdout
        assert stdin is not None and stdout is not None  # both are pipes (__init__)
        return stdin, stdout

    def close(self) -> None:
        """Stop the server (its children have all ended) and remove its files."""
        proc, self._proc = self._proc, None
        if proc is not None:
            assert proc.stdin is not None and proc.stdout is not None
            with contextlib.suppress(OSError):
                proc.stdin.close()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            proc.stdout.close()
        shutil.rmtree(self._files, ignore_errors=True)


def fork_server_available() -> bool:
    """True where children can be forked from a server (``os.fork`` and pidfds)."""
    return hasattr(os, "fork") and hasattr(os, "pidfd_open")


@contextlib.contextmanager
def using_fork_server(
    preload: Sequence[str] = PRELOADED, *, server: ForkServer | None = None
) -> Iterator[ForkServer | None]:
    """Inside, :func:`run_python` forks children from one pre-imported server (yielded;
    started at the first child; None where :func:`fork_server_available` is False, and
    children start as before).

    Args:
        preload: the modules a server started here imports.
        server: use this server instead of starting one, and leave it running at the
            end (a test session keeps one for all its tests).
    """
    if not fork_server_available() or _active[0] is not None:
        yield _active[0]
        return
    owned = server is None
    active = ForkServer(preload) if server is None else server
    _active[0] = active
    try:
        yield active
    finally:
        _active[0] = None
        if owned:
            active.close()


def run_python(
    code: str,
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    timeout: float,
    cwd: str | os.PathLike[str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python -c code args...`` with ``env`` in ``cwd``, its output captured as text: a
    fork of the server inside :func:`using_fork_server`, else a fresh interpreter.

    Raises:
        subprocess.TimeoutExpired: the child ran longer than ``timeout`` (it is killed).
    """
    server = _active[0]
    if server is not None:
        return server.run(code, args, env=env, timeout=timeout, cwd=cwd)
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=dict(env),
        timeout=timeout,
        check=False,
        cwd=cwd,
    )


# -- the server ---------------------------------------------------------------------


def _serve() -> None:
    """The server's main: import, then fork a child per request; the child returns from
    :func:`_requests` and becomes ``python -c`` (so it ends as an interpreter does)."""
    import importlib  # noqa: PLC0415

    # what a new interpreter's sys.path holds without a PYTHONPATH (stdlib, site-packages
    # and their .pth entries): asked of one, once
    bare = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    listed = subprocess.run(
        [sys.executable, "-c", "import json, sys; print(json.dumps(sys.path[1:]))"],
        env=bare,
        capture_output=True,
        text=True,
        check=True,
    )
    _base_path[:] = json.loads(listed.stdout)
    for module in sys.argv[1:]:
        importlib.import_module(module)
    request = _requests()
    if request is not None:
        _become(request)


_base_path: list[str] = []
"""The ``sys.path`` of ``python -c`` without a PYTHONPATH, but for its first entry (the
standard library, site-packages): a child's own PYTHONPATH goes before it."""


def _python_path(env: Mapping[str, str]) -> list[str]:
    """The entries ``python`` would put on ``sys.path`` for ``env``'s PYTHONPATH."""
    return [os.path.abspath(path) for path in env.get("PYTHONPATH", "").split(os.pathsep) if path]


def _requests() -> dict[str, Any] | None:
    """Serve until stdin closes (returns None); in a forked child, return its request."""
    for line in sys.stdin.buffer:
        request = json.loads(line)
        # The imported modules' objects move to a generation the collector never scans:
        # a child's collections and its exit then leave those pages shared, not copied
        # (CPython's advice for fork servers); the child's own objects are collected.
        gc.freeze()
        pid = os.fork()
        if pid == 0:
            return dict(request)
        returncode, timed_out = _wait(pid, float(request["timeout"]))
        reply = {"returncode": returncode, "timed_out": timed_out}
        os.write(1, json.dumps(reply).encode() + b"\n")
    return None


def _wait(pid: int, timeout: float) -> tuple[int, bool]:
    """Wait for child ``pid`` (killed after ``timeout`` s); returns its returncode as
    subprocess gives it (``-signal`` when a signal ended it), and whether it timed out."""
    fd = os.pidfd_open(pid)
    try:
        ready, _, _ = select.select([fd], [], [], timeout)
    finally:
        os.close(fd)
    if not ready:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), not ready


def _become(request: dict[str, Any]) -> None:
    """In the forked child: take the request's environment, directory and output files,
    then run its code as ``python -c`` would (``SystemExit`` ends the interpreter)."""
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    if os.environ.get("PYTHONUNBUFFERED"):
        sys.stdout.reconfigure(write_through=True)  # type: ignore[union-attr]
    # sys.path as ``python -c`` builds it from this child's PYTHONPATH, not the server's
    sys.path[:] = ["", *_python_path(os.environ), *_base_path]
    sys.path_importer_cache.clear()
    sys.argv = ["-c", *request["args"]]
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    exec(compile(request["code"], "<string>", "exec"), namespace)  # noqa: S102


__all__ = [
    "PRELOADED",
    "ForkServer",
    "fork_server_available",
    "run_python",
    "using_fork_server",
]
