"""Serving the page: a socket on 127.0.0.1 only, a fresh token, uvicorn.

The socket is bound before anything is announced, so the URL handed to
``on_ready`` names the real port (``port=0`` picks a free one) and connections
made as soon as it is known wait in the listen queue.
"""

from __future__ import annotations

import logging
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
"""The only address the page is served on."""


def bind_loopback(port: int) -> socket.socket:
    """A listening TCP socket on 127.0.0.1:``port`` (0: any free port).

    Raises:
        OSError: the port is taken or not allowed.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((LOOPBACK, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


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
    """The URL to open: the loopback address, the port and the token."""
    return f"http://{LOOPBACK}:{access.port}/?{TOKEN_PARAM}={access.token}"


def serve(
    store: Store,
    *,
    port: int = 0,
    read_only: bool = False,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve ``store``'s page until the process is interrupted (Ctrl-C or SIGTERM).

    Args:
        port: the port on 127.0.0.1 (0: a free one).
        read_only: refuse every action (settle, answer, resume, cancel, restart, fork).
        on_ready: called with the page's URL (it holds the token) once the socket listens.
    """
    sock = bind_loopback(port)
    access = Access(token=new_token(), port=sock.getsockname()[1], read_only=read_only)
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
    log.info("afk-local ui: serving %s on %s:%d", store.root, LOOPBACK, access.port)
    try:
        server.run(sockets=[sock])
    finally:
        app.state.run_changes.close()
        sock.close()


__all__ = ["LOOPBACK", "bind_loopback", "page_url", "serve"]
