"""The :class:`RunContext` of the job body running now, for wrappers called without a ctx.

A drop-in wrapper (``DurableRunner.run(agent, input)`` in place of the Agents SDK's
``Runner.run``) is called inside an ``@afk.durable`` job without the job's ``ctx``:
it finds it here. The runner marks the job body with :func:`running` while it runs;
:func:`current_run_context` then finds the context

- through a :class:`contextvars.ContextVar`, so in the body itself, in the asyncio
  tasks it starts (they copy the context), in ``asyncio.to_thread`` and in threads
  started with a copied context (``contextvars.copy_context().run``);
- in a thread started without a copy (``threading.Thread``, a ``ThreadPoolExecutor``),
  through the process's running bodies, when exactly one job body runs in the process
  (two running at once is ambiguous: the caller must pass the ctx).
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from afk_local.runner.run.run_context import RunContext

__all__ = ["current_run_context", "running"]

_current: contextvars.ContextVar[RunContext | None] = contextvars.ContextVar(
    "afk_local_current_run_context", default=None
)
_running: list[RunContext] = []  # the job bodies running in this process, in start order
_lock = threading.Lock()


@contextlib.contextmanager
def running(ctx: RunContext) -> Iterator[None]:
    """Mark ``ctx``'s job body as running (in this context and in this process) while inside."""
    token = _current.set(ctx)
    with _lock:
        _running.append(ctx)
    try:
        yield
    finally:
        with _lock:
            _running.remove(ctx)
        _current.reset(token)


def current_run_context() -> RunContext | None:
    """The context of the ``@afk.durable`` job body this code runs in; None outside any.

    Raises:
        RuntimeError: called in a thread that did not copy the job's context while
            several job bodies run in this process (which one is meant cannot be told).
    """
    ctx = _current.get()
    if ctx is not None:
        return ctx
    with _lock:
        bodies = list(_running)
    if len(bodies) > 1:
        raise RuntimeError(
            f"{len(bodies)} durable job bodies run in this process and this thread was not "
            "started with one's context: pass the job's ctx explicitly, or start the thread "
            "with contextvars.copy_context().run"
        )
    return bodies[0] if bodies else None
