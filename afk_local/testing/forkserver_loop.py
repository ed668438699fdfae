"""The fork server's own process (:mod:`afk_local.testing.forkserver` is its client).

:func:`serve` imports the modules it is told to, then forks one child per request that
arrives on its standard input (a ``SOCK_SEQPACKET`` socket: the request as JSON, the
child's stdout and stderr descriptors with it), tells the client each child's pid and,
when it ends, its exit status. A forked child returns from the loop and becomes
``python -c CODE ARGS...``: the request's environment, directory, ``sys.argv`` and
``sys.path``, its code run in ``__main__``, so it ends as an interpreter ends.
"""

from __future__ import annotations

import builtins
import contextlib
import gc
import io
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from typing import Any

MESSAGE_BYTES = 1 << 20
"""The largest request or reply (code, arguments and environment of one child)."""


def serve() -> None:
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
    request = _requests(socket.socket(fileno=0))
    if request is not None:
        _become(request)


_base_path: list[str] = []
"""The ``sys.path`` of ``python -c`` without a PYTHONPATH, but for its first entry (the
standard library, site-packages): a child's own PYTHONPATH goes before it."""


def _python_path(env: Mapping[str, str]) -> list[str]:
    """The entries ``python`` would put on ``sys.path`` for ``env``'s PYTHONPATH."""
    return [os.path.abspath(path) for path in env.get("PYTHONPATH", "").split(os.pathsep) if path]


def _requests(channel: socket.socket) -> dict[str, Any] | None:
    """Serve until the client closes the channel and every child ended (returns None);
    in a forked child, return its request (with its stdout and stderr descriptors)."""
    running: dict[int, tuple[int, int, float | None]] = {}  # pidfd: id, pid, deadline
    timed_out: set[int] = set()
    open_channel = True
    while open_channel or running:
        deadlines = [d for _, _, d in running.values() if d is not None]
        wait = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
        watched = [channel.fileno(), *running] if open_channel else list(running)
        ready, _, _ = select.select(watched, [], [], wait)
        for pidfd, (ident, pid, deadline) in list(running.items()):
            if deadline is not None and time.monotonic() >= deadline and pidfd not in ready:
                os.kill(pid, signal.SIGKILL)
                timed_out.add(ident)
                running[pidfd] = (ident, pid, None)
        for fd in ready:
            if fd == channel.fileno():
                data, fds, _, _ = socket.recv_fds(channel, MESSAGE_BYTES, 2)
                if not data:
                    open_channel = False
                    continue
                request = json.loads(data)
                # The imported modules' objects move to a generation the collector never
                # scans: a child's collections and its exit then leave those pages
                # shared, not copied (CPython's advice for fork servers).
                gc.freeze()
                pid = os.fork()
                if pid == 0:
                    channel.close()
                    for other in running:
                        os.close(other)
                    return {**request, "fds": fds}
                for given in fds:
                    os.close(given)
                timeout = request["timeout"]
                deadline = None if timeout is None else time.monotonic() + float(timeout)
                running[os.pidfd_open(pid)] = (request["id"], pid, deadline)
                channel.send(json.dumps({"id": request["id"], "pid": pid}).encode())
            else:
                ident, pid, _ = running.pop(fd)
                os.close(fd)
                _, status = os.waitpid(pid, 0)
                reply = {
                    "id": ident,
                    "returncode": os.waitstatus_to_exitcode(status),
                    "timed_out": ident in timed_out,
                }
                timed_out.discard(ident)
                with contextlib.suppress(OSError):  # the client went away
                    channel.send(json.dumps(reply).encode())
    return None


def _become(request: dict[str, Any]) -> None:
    """In the forked child: take the request's environment, directory and output
    descriptors, then run its code as ``python -c`` would (``SystemExit`` ends the
    interpreter)."""
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd, given in zip((1, 2), request["fds"], strict=True):
        os.dup2(given, fd)
        os.close(given)
    if os.environ.get("PYTHONUNBUFFERED"):  # as python -u: no buffer under the text layer
        for name, fd in (("stdout", 1), ("stderr", 2)):
            setattr(sys, name, io.TextIOWrapper(
                io.FileIO(fd, "w", closefd=False),
                encoding="utf-8", errors="backslashreplace" if fd == 2 else "strict",
                write_through=True,
            ))  # fmt: skip
    # sys.path as ``python -c`` builds it from this child's PYTHONPATH, not the server's
    sys.path[:] = ["", *_python_path(os.environ), *_base_path]
    sys.path_importer_cache.clear()
    sys.argv = ["-c", *request["args"]]
    # the code runs in the real __main__ module, emptied to what ``python -c`` starts
    # with: functions it defines are ``__main__.NAME`` (pickled, named as entry points)
    main = sys.modules["__main__"].__dict__
    loader = main.get("__loader__")
    main.clear()
    main.update(__name__="__main__", __doc__=None, __package__=None, __loader__=loader)
    main.update(__spec__=None, __annotations__={}, __builtins__=builtins)
    exec(compile(request["code"], "<string>", "exec"), main)  # noqa: S102


__all__ = ["MESSAGE_BYTES", "serve"]
