"""Server-sent events: the ``text/event-stream`` answer and the shape of one event.

:class:`EventStream` is Starlette's streaming answer that always listens for the
client going away (whatever ASGI version the server speaks), so a closed tab ends
its stream at once rather than at the next write.
"""

from __future__ import annotations

import contextlib

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

SSE_HEADERS = {"cache-control": "no-store", "x-accel-buffering": "no"}
"""Headers of an event stream: never cached, never buffered."""
HEARTBEAT = b": still here\n\n"
"""A comment line: keeps the connection known to be open, shown to no script."""


def sse_event(kind: str, data: str) -> bytes:
    """One event named ``kind`` carrying ``data`` (several ``data:`` lines when it has newlines)."""
    lines = "".join(f"data: {line}\n" for line in data.replace("\r", "").split("\n"))
    return f"event: {kind}\n{lines}\n".encode()


class EventStream(StreamingResponse):
    """A ``text/event-stream`` answer that stops when the client disconnects."""

    media_type = "text/event-stream"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Stream until the body ends or the client goes, whichever comes first."""
        async with anyio.create_task_group() as group:

            async def stream() -> None:
                with contextlib.suppress(OSError):  # the client went while we wrote
                    await self.stream_response(send)
                group.cancel_scope.cancel()

            group.start_soon(stream)
            await self.listen_for_disconnect(receive)
            group.cancel_scope.cancel()


__all__ = ["HEARTBEAT", "SSE_HEADERS", "EventStream", "sse_event"]
