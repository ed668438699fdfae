"""Shared pieces of the benchmark scripts: deterministic data, timing, tables."""

from __future__ import annotations

import contextlib
import random
import statistics
import time
from collections.abc import Callable, Iterator, Sequence

from afk_local.storage import fsio

_WORDS = [
    "the",
    "agent",
    "reads",
    "a",
    "file",
    "and",
    "then",
    "calls",
    "a",
    "tool",
    "to",
    "search",
    "for",
    "the",
    "answer",
    "while",
    "the",
    "user",
    "waits",
    "for",
    "a",
    "reply",
    "about",
    "invoices",
    "payments",
    "emails",
    "schedules",
    "reports",
    "tickets",
    "customers",
    "orders",
    "refunds",
    "shipping",
    "weather",
    "research",
    "summary",
    "analysis",
    "python",
    "function",
    "result",
    "error",
    "retry",
    "checkpoint",
    "resume",
    "state",
    "message",
    "assistant",
    "system",
    "context",
    "token",
    "budget",
    "cost",
    "model",
]


def text(rng: random.Random, n_bytes: int) -> str:
    """Plausible chat text of about ``n_bytes`` (words drawn from a small vocabulary)."""
    words: list[str] = []
    size = 0
    while size < n_bytes:
        word = rng.choice(_WORDS)
        if rng.random() < 0.15:
            word = f"{word}-{rng.randrange(10_000)}"
        words.append(word)
        size += len(word) + 1
    return " ".join(words)[:n_bytes]


def conversation_step(
    rng: random.Random, messages: list[dict[str, str]], n_bytes: int = 500
) -> None:
    """Append one ~``n_bytes`` message to a growing conversation."""
    role = "user" if len(messages) % 2 == 0 else "assistant"
    messages.append({"role": role, "content": text(rng, n_bytes)})


def median_us(fn: Callable[[], object], repeat: int) -> float:
    """Median wall time of ``fn()`` in microseconds over ``repeat`` calls."""
    samples = []
    for _ in range(repeat):
        start = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - start) / 1000)
    return statistics.median(samples)


def seconds_per_run(fn: Callable[[int], object], runs: int, start: int) -> float:
    """Mean seconds of ``fn(i)`` over ``runs`` calls, ``i`` counting from ``start``
    (so each round of an interleaved benchmark uses fresh run ids)."""
    began = time.perf_counter()
    for i in range(runs):
        fn(start + i)
    return (time.perf_counter() - began) / runs


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain aligned text table (also valid Markdown)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in cells
    ]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


@contextlib.contextmanager
def no_fsync() -> Iterator[None]:
    """Build large fixtures fast: fsync becomes a no-op. Never used for a measured write."""
    original = fsio.Env.fsync_fd  # every Env's fsync, the module-level one's included
    fsio.Env.fsync_fd = lambda self, fd, path="": None  # type: ignore[method-assign]
    try:
        yield
    finally:
        fsio.Env.fsync_fd = original  # type: ignore[method-assign]
