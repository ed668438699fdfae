"""A page's work abandoned when its client goes away.

A page of a large store can take long (a filter that reads every run); a browser that
gave up must not leave the server reading on. :func:`while_client_waits` runs the
page's work on a thread with a store (:class:`AbandonableStore`) whose every call
first checks that the client is still connected, and raises :class:`ClientGone` once
the server saw it disconnect: the work stops at its next read of the store.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar, cast

import anyio
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from afk_local.storage.store import Store

log = logging.getLogger("afk_local")

T = TypeVar("T")


class ClientGone(Exception):
    """The client of a request disconnected: its page's work was abandoned."""


class AbandonableStore:
    """``store`` whose every method call raises :class:`ClientGone` once ``gone`` is set."""

    def __init__(self, store: Store, gone: threading.Event) -> None:
        self._store = store
        self._gone = gone

    def __getattr__(self, name: str) -> Any:
        """The store's attribute; a method checks ``gone`` before each call."""
        value = getattr(self._store, name)
        if not callable(value):
            return value
        gone = self._gone

        def checked(*args: Any, **kwargs: Any) -> Any:
            if gone.is_set():
                log.info("ui: a page's client went: its work stops before store.%s", name)
                raise ClientGone(name)
            return value(*args, **kwargs)

        return checked


async def while_client_waits(request: Request, store: Store, work: Callable[[Store], T]) -> T:
    """``work(store)`` on a thread, abandoned (:class:`ClientGone`) if the client goes first."""
    gone = threading.Event()

    async def watch() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                log.info("ui: the client of %s went", request.url.path)
                gone.set()
                return

    failed: Exception | None = None
    async with anyio.create_task_group() as group:
        group.start_soon(watch)
        try:
            result = await run_in_threadpool(work, cast(Store, AbandonableStore(store, gone)))
        except Exception as exc:  # raised as it is below, not wrapped in the group's
            failed = exc
        finally:
            group.cancel_scope.cancel()
    if failed is not None:
        raise failed
    return result


__all__ = ["AbandonableStore", "ClientGone", "while_client_waits"]
