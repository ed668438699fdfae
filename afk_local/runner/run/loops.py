"""The bookkeeping of ``ctx.iterate`` loops: cursors, which items are done, step scopes.

A loop's cursor lives in the checkpoint (``cursors`` in the payload): the count
of items done (``{"n": 5}``) or, with ``key=``, their keys (``{"done": [...]}``).
Steps inside an item are scoped to it (``iterate#1[17]/fetch#1``), so skipping
finished items never shifts the keys of the others.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

ITERATE = "@iterate"
"""The counter that numbers unnamed loops (``iterate#1``, ``iterate#2``...)."""


@dataclass
class Scope:
    """Where step keys are counted: the whole job, or one loop item (``prefix``)."""

    prefix: str
    counters: dict[str, int]


@dataclass
class Loop:
    """One ``iterate`` loop of this attempt: its checkpointed cursor and what it skips."""

    name: str
    cursor: dict[str, Any]
    key: Callable[[Any], Any] | None
    done_keys: set[str]
    skip: int
    outer: bool = False
    """Not nested in another loop's item: its items are the run's progress."""

    @classmethod
    def open(
        cls,
        cursors: dict[str, Any],
        scope: Scope,
        items: Iterable[Any],
        key: Callable[[Any], Any] | None,
        name: str | None,
        *,
        outer: bool,
    ) -> Loop:
        """The loop ``name`` (default ``iterate#n``) in ``scope``, continuing its cursor."""
        if isinstance(items, (str, bytes)):
            raise TypeError("iterate() over a str or bytes is almost surely a mistake")
        if name is None:
            count = scope.counters.get(ITERATE, 0) + 1
            scope.counters[ITERATE] = count
            name = f"iterate#{count}"
        full = scope.prefix + name
        fresh: dict[str, Any] = {"n": 0} if key is None else {"done": []}
        cursor: dict[str, Any] = cursors.setdefault(full, fresh)
        cursor.setdefault("n" if key is None else "done", 0 if key is None else [])
        done_keys = set(cursor.get("done", ())) if key is not None else set()
        skip = int(cursor.get("n", 0)) if key is None else 0
        return cls(full, cursor, key, done_keys, skip, outer)

    def pending(self, index: int, item: Any) -> str | None:
        """The item's identity in the cursor, or None when an earlier attempt finished it."""
        if self.key is None:
            return None if index < self.skip else str(index)
        ident = str(self.key(item))
        return None if ident in self.done_keys else ident

    def done_count(self) -> int:
        """How many items are done."""
        return int(self.cursor["n"]) if "n" in self.cursor else len(self.cursor["done"])

    def mark_done(self, index: int, ident: str, cursors: dict[str, Any]) -> None:
        """Record the item as done; the cursors of loops nested in it are dropped."""
        if "n" in self.cursor:
            self.cursor["n"] = index + 1
        else:
            self.cursor["done"].append(ident)
            self.done_keys.add(ident)
        inner = f"{self.name}[{ident}]/"
        for name in [n for n in cursors if n.startswith(inner)]:
            del cursors[name]  # loops nested in a finished item are never re-entered

    def item_scope(self, ident: str) -> Scope:
        """The step scope of one item."""
        return Scope(f"{self.name}[{ident}]/", {})


def total_of(items: Iterable[Any]) -> int | None:
    """How many items, when the iterable knows (a list, a range...)."""
    return len(items) if hasattr(items, "__len__") else None  # type: ignore[arg-type]


async def as_async(items: Iterator[T]) -> AsyncIterator[T]:
    """A sync iterator as an async one."""
    for item in items:
        yield item


__all__ = ["ITERATE", "Loop", "Scope", "as_async", "total_of"]
