"""``ctx.iterate``: a loop that resumes after its last finished item, with a progress bar.

Each item runs in a step scope of its own; its position is saved in the run's cursors
(:mod:`.loops`) with every checkpoint. A base class of
:class:`~afk_local.runner.run.run_context.RunContext`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Callable,
    Iterable,
    Iterator,
)
from typing import Any, TypeVar

from afk_local.runner.observe.progress import Progress
from afk_local.runner.run.loops import Loop, Scope, as_async, total_of
from afk_local.runner.time.durable_time import DurableTime

T = TypeVar("T")


class Iterating(DurableTime):
    """The loops of a run context: ``iterate`` and the scope of each item."""

    _cursors: dict[str, Any]
    _scopes: list[Scope]

    def iterate(
        self,
        items: Iterable[T],
        key: Callable[[T], str | int] | None = None,
        *,
        name: str | None = None,
        progress: bool = True,
    ) -> Iterator[T]:
        """Yield the items not done yet; after the loop body for one returns, checkpoint.

        Args:
            items: any iterable; it must yield the same items in the same order
                on resume when ``key`` is None (positions identify items).
            key: ``key(item)`` identifies items instead of positions (use it when
                the order may change between attempts).
            name: the loop's name in the checkpoint (default ``iterate#n``).
            progress: show progress on stderr (tqdm when installed, rich or one
                line on a terminal, periodic lines in a log; see :mod:`.progress`);
                ``False`` for none.

        An item whose body raised or did ``break`` is not done. Steps inside the
        body get keys scoped to the item, so skipped items do not shift them. The
        items of a loop not nested in another loop's item are the run's progress
        (n/N in ``afk-local runs``), unless :meth:`progress` declared another.
        """
        loop, total = self._open_loop(items, key, name)
        bar = Progress(total, loop.done_count(), desc=loop.name, enabled=self._shows(progress))
        return self._loop(items, loop, bar)

    def _open_loop(
        self, items: Iterable[Any], key: Callable[[Any], Any] | None, name: str | None
    ) -> tuple[Loop, int | None]:
        outer = len(self._scopes) == 1
        loop = Loop.open(self._cursors, self._scopes[-1], items, key, name, outer=outer)
        total = total_of(items)
        if outer:
            self._report.loop_opened(total, loop.done_count())
        return loop, total

    def _loop(self, items: Iterable[T], loop: Loop, bar: Progress) -> Iterator[T]:
        try:
            for index, item in enumerate(items):
                ident = loop.pending(index, item)
                if ident is None:
                    continue
                with self._item_scope(loop, ident, index):
                    yield item
                self._item_done(loop, index, ident)
                bar.update()
        finally:
            bar.close()

    def _shows(self, progress: bool) -> bool:
        """Whether a loop shows its progress: never while its run is only replayed."""
        return progress and not self._writer.effects.replaying

    @contextlib.contextmanager
    def _item_scope(self, loop: Loop, ident: str, index: int) -> Iterator[None]:
        """Scope the steps of the loop body to this item, so skipped items do not shift keys.

        Metrics recorded meanwhile default to the item's ``index`` as their step.
        """
        scope = loop.item_scope(ident)
        self._scopes.append(scope)
        outer_index, self._report.item_index = self._report.item_index, index
        try:
            yield
        finally:
            self._report.item_index = outer_index
            self._drop_scope(scope)

    def _item_done(self, loop: Loop, index: int, ident: str) -> None:
        loop.mark_done(index, ident, self._cursors)
        if loop.outer:
            self._report.item_done(loop.done_count())
        self.checkpoint()

    def _drop_scope(self, scope: Scope) -> None:
        for i in range(len(self._scopes) - 1, 0, -1):
            if self._scopes[i] is scope:
                del self._scopes[i]
                return

    async def aiterate(
        self,
        items: Iterable[T] | AsyncIterable[T],
        key: Callable[[T], str | int] | None = None,
        *,
        name: str | None = None,
        progress: bool = True,
    ) -> AsyncIterator[T]:
        """The async twin of :meth:`iterate`: ``async for item in ctx.aiterate(items)``."""
        loop, total = self._open_loop(items, key, name)  # type: ignore[arg-type]
        bar = Progress(total, loop.done_count(), desc=loop.name, enabled=self._shows(progress))
        source: AsyncIterator[T] = (
            aiter(items) if isinstance(items, AsyncIterable) else as_async(iter(items))
        )
        try:
            index = -1
            async for item in source:
                index += 1
                ident = loop.pending(index, item)
                if ident is None:
                    continue
                with self._item_scope(loop, ident, index):
                    yield item
                await asyncio.to_thread(self._item_done, loop, index, ident)
                bar.update()
        finally:
            bar.close()
