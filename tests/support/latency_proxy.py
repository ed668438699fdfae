"""A TCP proxy on loopback that delays every chunk it forwards: a slow network for tests.

``LatencyProxy(("127.0.0.1", port), delay_s)`` listens on a free loopback port and
forwards each connection to the target, sleeping ``delay_s`` before passing on each
chunk in either direction, so every request and every response of an HTTP exchange
arrives at least ``delay_s`` late. It widens the windows between a remote request and
its effect, which is what races between two machines need to show up.

:meth:`LatencyProxy.down` takes the remote away (open connections are cut, new ones
closed at once, as a network outage or a dead endpoint would) until :meth:`up`.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time


class LatencyProxy:
    """Forward ``127.0.0.1:<port>`` to ``target``, each chunk ``delay_s`` late."""

    def __init__(self, target: tuple[str, int], delay_s: float) -> None:
        self.target = target
        self.delay_s = delay_s
        self._server = socket.socket()
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(128)
        self._server.settimeout(0.1)
        self._stop = threading.Event()
        self._down = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self._server.getsockname()[1]}"

    def start(self) -> LatencyProxy:
        self._thread.start()
        return self

    def down(self) -> None:
        """Cut every open connection and refuse new ones until :meth:`up`."""
        self._down.set()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

    def up(self) -> None:
        """Forward connections again."""
        self._down.clear()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()
        self._server.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                continue
            if self._down.is_set():
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while not self._stop.is_set():
                data = src.recv(65536)
                if not data:
                    break
                if self.delay_s:
                    time.sleep(self.delay_s)
                if self._down.is_set():
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
