"""Serving the page: a socket on a loopback address of its own, a fresh token, uvicorn.

Browsers scope cookies by host, not by port: a token cookie set by ``127.0.0.1:8000``
is sent to every server on ``127.0.0.1``, whatever its port. So each launch picks a
random address of its own in ``127.0.0.0/8`` (every one of them is loopback on Linux
and Windows), and its cookie goes to no other server the user visits. Where the system
has only ``127.0.0.1`` (macOS by default), the page falls back to it and says so.

The socket is bound before anything is announced, so the URL handed to
``on_ready`` names the real address and port (``port=0`` picks a free one) and
connections made as soon as it is known wait in the listen queue.
"""

from __future__ import annotations

import errno
import logging
import secrets
import socket
from collections.abc import Callable
from types import FrameType

import uvicorn

from afk_local.storage.store import Store
from afk_local.ui.access import TOKEN_PARAM, Access, new_token
from afk_local.ui.app import create_app
from afk_local.ui.events import RunChanges

log = logging.getLogger("afk_local")

LOOPBACK = "127.0.0.1"
"""The loopback address every system has: the page's fallback address."""


def launch_address() -> str:
    """A random loopback address for one launch: ``127.A.B.C`` (never ``127.0.0.x``)."""
    a = 1 + secrets.randbelow(254)
    return f"127.{a}.{secrets.randbelow(256)}.{1 + secrets.randbelow(254)}"


def _bind(address: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((address, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def bind_loopback(port: int) -> socket.socket:
    """A listening TCP socket on a fresh loopback address (:func:`launch_address`), ``port``.

    ``port=0`` picks a free one. Where the system has no such address, the socket is on
    ``127.0.0.1`` and a warning says that the page's cookie is then sent to the other
    servers of ``127.0.0.1`` too.

    Raises:
        OSError: the port is taken or not allowed.
    """
    try:
        return _bind(launch_address(), port)
    except OSError as exc:
        if exc.errno != errno.EADDRNOTAVAIL:
            raise
    log.warning(
        "afk-local ui: this system has no loopback address but %s: the page's cookie is "
        "sent to every other server on it (docs/ui.md, 'Who can use the page')",
        LOOPBACK,
    )
    return _bind(LOOPBACK, port)


SHUTDOWN_GRACE_S = 5
"""The longest a stopping server waits for answers still being written."""


class _Server(uvicorn.Server):
    """uvicorn's server, ending the open event streams as soon as it is told to stop."""

    def __init__(self, config: uvicorn.Config, changes: RunChanges) -> None:
        super().__init__(config)
        self.changes = changes

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Stop: end the event streams (else uvicorn waits for them), then shut down."""
        self.changes.close()
        super().handle_exit(sig, frame)


def page_url(access: Access) -> str:
    """The URL to open: the server's loopback address, its port and the token."""
    return f"http://{access.host}:{access.port}/?{TOKEN_PARAM}={access.token}"


def serve(
    store: Store,
    *,
    port: int = 0,
    read_only: bool = False,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve ``store``'s page until the process is interrupted (Ctrl-C or SIGTERM).

    Args:
        port: the port on the server's loopback address (0: a free one).
        read_only: refuse every action (settle, answer, resume, cancel, restart, fork).
        on_ready: called with the page's URL (it holds the token) once the socket listens.
    """
    sock = bind_loopback(port)
    host, bound_port = sock.getsockname()[:2]
    access = Access(token=new_token(), port=bound_port, host=host, read_only=read_only)
    app = create_app(store, access)
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
    )
    server = _Server(config, app.state.run_changes)
    if on_ready is not None:
        on_ready(page_url(access))
    log.info("afk-local ui: serving %s on %s:%d", store.root, access.host, access.port)
    try:
        server.run(sockets=[sock])
    finally:
        app.state.run_changes.close()
        sock.close()


__all__ = ["LOOPBACK", "bind_loopback", "launch_address", "page_url", "serve"]
