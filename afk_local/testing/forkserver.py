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
with ``sys.argv`` and ``sys.path`` as ``python -c`` would give it, with the environment
and directory it was asked for, and it ends as an interpreter ends (threads joined,
``atexit`` handlers run) or is SIGKILLed where ``CODE`` kills it.

:func:`run_python` runs a child to its end and returns its captured output;
:func:`popen_python` starts one and returns at once a :class:`ForkedProcess` whose
stdout and stderr are pipes read as it writes them, as ``subprocess.Popen`` gives (a
crash test reads a child's lines and SIGKILLs it between two of them). Outside
:func:`using_fork_server` both start a fresh interpreter, as they always did. Where
``os.fork`` or ``os.pidfd_open`` does not exist (not Linux), the server is not used.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import IO, Any

from afk_local.testing.forkserver_loop import MESSAGE_BYTES

PRELOADED = ("afk_local.cli", "afk_local.testing", "afk_local.testing.fuzz.jobs")
"""Modules the server imports once, so no child pays for them."""

_SERVER = "from afk_local.testing.forkserver_loop import serve; serve()"

_active: list[ForkServer | None] = [None]


class ForkedProcess:
    """A child forked by a :class:`ForkServer`: the parts of ``subprocess.Popen`` (text
    mode, stdout and stderr pipes) that tests use. It is not this process's child (the
    server's), so it is signalled through a pidfd and its exit status comes from the
    server."""

    def __init__(self, args: list[str], stdout: IO[str] | None, stderr: IO[str] | None) -> None:
        self.args = args
        """``[python, "-c", code, *args]``, as ``Popen.args``."""
        self.stdin: IO[str] | None = None
        self.stdout = stdout
        """The child's standard output, read as it writes (None when captured to a file)."""
        self.stderr = stderr
        """The child's standard error, read as it writes (None when captured to a file)."""
        self.pid = 0
        """The child's process id."""
        self.returncode: int | None = None
        """Its exit code once it ended (``-signal`` when a signal ended it), else None."""
        self.timed_out = False
        """Whether the server killed it for running past its timeout."""
        self._pidfd: int | None = None
        self._started = threading.Event()
        self._ended = threading.Event()

    def _start(self, pid: int) -> None:
        self.pid = pid
        with contextlib.suppress(OSError):  # already ended and reaped by the server
            self._pidfd = os.pidfd_open(pid)
        self._started.set()

    def _end(self, returncode: int, timed_out: bool) -> None:
        self.returncode, self.timed_out = returncode, timed_out
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        self._ended.set()

    def poll(self) -> int | None:
        """The exit code if the child ended, else None."""
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the child to end; returns its exit code.

        Raises:
            subprocess.TimeoutExpired: it still runs after ``timeout`` seconds.
        """
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        assert self.returncode is not None  # set before _ended
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the child unless it already ended."""
        pidfd = self._pidfd
        if self.returncode is None and pidfd is not None:
            with contextlib.suppress(ProcessLookupError, OSError):
                signal.pidfd_send_signal(pidfd, sig)

    def kill(self) -> None:
        """SIGKILL the child."""
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        """SIGTERM the child."""
        self.send_signal(signal.SIGTERM)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Read stdout and stderr to their end, wait for the child; returns both.

        Raises:
            subprocess.TimeoutExpired: the child did not end within ``timeout`` seconds.
        """
        read: dict[str, str] = {}
        threads = [
            threading.Thread(target=lambda n=n, f=f: read.__setitem__(n, f.read()), daemon=True)
            for n, f in (("out", self.stdout), ("err", self.stderr))
            if f is not None
        ]
        for thread in threads:
            thread.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return read.get("out", ""), read.get("err", "")

    def __enter__(self) -> ForkedProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        for stream in (self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        self.wait()


class ForkServer:
    """A pre-imported process that forks one child per :meth:`run` or :meth:`popen`
    (module docstring); children may run at the same time.

    Args:
        preload: modules to import in the server before the first fork.
    """

    def __init__(self, preload: Sequence[str] = PRELOADED) -> None:
        self._preload = tuple(preload)
        self._proc: subprocess.Popen[bytes] | None = None
        self._socket: socket.socket | None = None
        self._lock = threading.Lock()
        self._children: dict[int, ForkedProcess] = {}
        self.children = 0
        """Children forked so far."""

    @property
    def pid(self) -> int:
        """The server's process id (it starts at its first child, or here)."""
        return self._started()[0].pid

    def _started(self) -> tuple[subprocess.Popen[bytes], socket.socket]:
        if self._proc is None or self._socket is None:
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            with theirs:  # the server's standard input: its only channel
                self._proc = subprocess.Popen(
                    [sys.executable, "-c", _SERVER, *self._preload],
                    stdin=theirs.fileno(),
                    stdout=subprocess.DEVNULL,
                    env=env,
                )
            self._socket = ours
            threading.Thread(target=self._replies, args=(ours,), daemon=True).start()
        return self._proc, self._socket

    def _replies(self, channel: socket.socket) -> None:
        """Hand each reply of the server to its child (a thread of this process)."""
        while True:
            try:
                data = channel.recv(MESSAGE_BYTES)
            except OSError:
                data = b""
            if not data:  # the server ended: so did every child it could tell us about
                for child in list(self._children.values()):
                    child._started.set()  # pid 0: _fork says the server died
                    child._end(-signal.SIGKILL, False)
                return
            reply = json.loads(data)
            child = self._children[reply["id"]]
            if "pid" in reply:
                child._start(reply["pid"])
            else:
                del self._children[reply["id"]]
                child._end(reply["returncode"], reply["timed_out"])

    def _fork(
        self,
        child: ForkedProcess,
        request: dict[str, Any],
        fds: Sequence[int],
    ) -> ForkedProcess:
        with self._lock:
            _, channel = self._started()
            self.children += 1
            request["id"] = self.children
            self._children[self.children] = child
            socket.send_fds(channel, [json.dumps(request).encode()], list(fds))
        if not child._started.wait(60):
            raise RuntimeError(f"the fork server (pid {self.pid}) did not fork")
        if child.pid == 0:
            raise RuntimeError(f"the fork server (pid {self.pid}) died")
        return child

    def popen(
        self,
        code: str,
        args: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str | os.PathLike[str] | None = None,
    ) -> ForkedProcess:
        """Start ``python -c code args...`` as a fresh fork of the server, its stdout and
        stderr text pipes to this process (``subprocess.Popen(..., stdout=PIPE,
        stderr=PIPE, text=True)``)."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        child = ForkedProcess(
            [sys.executable, "-c", code, *args],
            open(out_r, encoding="utf-8", errors="replace"),  # noqa: SIM115 - the caller's
            open(err_r, encoding="utf-8", errors="replace"),  # noqa: SIM115
        )
        try:
            return self._fork(child, _request(code, args, env, cwd, None), [out_w, err_w])
        finally:
            os.close(out_w)
            os.close(err_w)

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
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            child = ForkedProcess([sys.executable, "-c", code, *args], None, None)
            request = _request(code, args, env, cwd, timeout)
            self._fork(child, request, [out.fileno(), err.fileno()]).wait()
            texts = []
            for file in (out, err):
                file.seek(0)
                texts.append(file.read().decode("utf-8", errors="replace"))
        if child.timed_out:
            raise subprocess.TimeoutExpired(child.args, timeout, texts[0], texts[1])
        assert child.returncode is not None  # wait() returned
        return subprocess.CompletedProcess(child.args, child.returncode, texts[0], texts[1])

    def close(self) -> None:
        """Stop the server (once its children have all ended)."""
        proc, channel = self._proc, self._socket
        self._proc = self._socket = None
        if proc is not None and channel is not None:
            with contextlib.suppress(OSError):
                channel.shutdown(socket.SHUT_WR)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            channel.close()


def _request(
    code: str,
    args: Sequence[str],
    env: Mapping[str, str],
    cwd: str | os.PathLike[str] | None,
    timeout: float | None,
) -> dict[str, Any]:
    return {
        "code": code,
        "args": list(args),
        "env": dict(env),
        "cwd": os.fspath(cwd) if cwd is not None else os.getcwd(),
        "timeout": timeout,
    }


def fork_server_available() -> bool:
    """True where children can be forked from a server (``os.fork`` and pidfds)."""
    return hasattr(os, "fork") and hasattr(os, "pidfd_open")


@contextlib.contextmanager
def using_fork_server(
    preload: Sequence[str] = PRELOADED, *, server: ForkServer | None = None
) -> Iterator[ForkServer | None]:
    """Inside, :func:`run_python` and :func:`popen_python` fork children from one
    pre-imported server (yielded; started at the first child; None where
    :func:`fork_server_available` is False, and children start as before).

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


def popen_python(
    code: str,
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | os.PathLike[str] | None = None,
) -> subprocess.Popen[str] | ForkedProcess:
    """Start ``python -c code args...`` with ``env`` in ``cwd``, stdout and stderr text
    pipes: a fork of the server inside :func:`using_fork_server`, else a fresh
    interpreter (``subprocess.Popen``)."""
    server = _active[0]
    if server is not None:
        return server.popen(code, args, env=env, cwd=cwd)
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(env),
        cwd=cwd,
    )


__all__ = [
    "PRELOADED",
    "ForkServer",
    "ForkedProcess",
    "fork_server_available",
    "popen_python",
    "run_python",
    "using_fork_server",
]
