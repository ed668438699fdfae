"""The garbage collector paused while the index takes in 100,000 summaries at once.

Reading ``runs.changes`` or ``runs.index`` after a bulk of creations makes hundreds of
thousands of objects that live on (frames, summaries, the listing order). Each such
allocation counts towards the collector's next pass, and the full passes walk every
object the process holds, again and again: about a fifth of a first listing's CPU.
None of these objects can form a cycle, so nothing is left uncollected by pausing
the collector for the bulk work (no user code runs inside).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from typing import ParamSpec, TypeVar

_P = ParamSpec("_P")
_R = TypeVar("_R")

_lock = threading.Lock()
_depth = 0
_was_enabled = False


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector (``gc.disable``) inside the block.

    Nested and concurrent blocks (threads sharing a store) count: the collector is
    enabled again when the last block ends, and only if it was enabled when the first
    one began, so a program that disabled it keeps it disabled.
    """
    global _depth, _was_enabled  # noqa: PLW0603 - one collector per process
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()


def bulk(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """``method`` run with the collector paused (:func:`collector_paused`)."""

    @wraps(method)
    def paused(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with collector_paused():
            return method(*args, **kwargs)

    return paused


__all__ = ["bulk", "collector_paused"]
