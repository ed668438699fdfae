"""Durable jobs for the watcher tests, importable by child processes (``watcher_jobs:NAME``).

Each job prints ``start i`` when item ``i`` begins (after the previous item's
checkpoint), so a test can SIGKILL it at a known point.
"""

from __future__ import annotations

import os
import signal
import time

import afk_local as afk


def record(path: str, i: int, *, idempotency_key: str) -> int:
    """An outside side effect that deduplicates by idempotency key, like a real service."""
    with open(path, "a+", encoding="utf-8") as fh:
        fh.seek(0)
        if any(line.split()[1] == idempotency_key for line in fh.read().splitlines()):
            return i
        fh.write(f"{i} {idempotency_key}\n")
        fh.flush()
    return i


@afk.durable
def counter(ctx: afk.RunContext, out: str, n: int = 6, delay: float = 0.2) -> int:
    """n items, one journaled side effect each, ``delay`` seconds before each."""
    ctx.state.setdefault("sum", 0)
    for i in ctx.iterate(range(n), progress=False):
        print(f"start {i}", flush=True)
        time.sleep(delay)
        ctx.state["sum"] += ctx.step("record", record, out, i, idempotent=True)
    return int(ctx.state["sum"])


@afk.durable
def gated(ctx: afk.RunContext, out: str, gate: str) -> str:
    """Checkpoints once, then waits until the file ``gate`` exists."""
    ctx.step("record", record, out, 0, idempotent=True)
    ctx.checkpoint()
    print("waiting", flush=True)
    while not os.path.exists(gate):
        time.sleep(0.05)
    return "opened"


@afk.durable
def crasher(ctx: afk.RunContext) -> None:
    """Dies by SIGKILL every time, before making any progress."""
    print(f"attempt {ctx.attempt} crashing", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


@afk.durable
def flaky(ctx: afk.RunContext, out: str, flag: str) -> str:
    """Raises on its first attempt (the run becomes ``failed``), succeeds afterwards."""
    ctx.step("record", record, out, 0, idempotent=True)
    if not os.path.exists(flag):
        with open(flag, "w", encoding="utf-8"):
            pass
        raise RuntimeError("first attempt fails on purpose")
    return "fine"


def slow_record(path: str, i: int, delay: float) -> int:
    """A slow outside side effect that does NOT deduplicate: running it twice shows."""
    time.sleep(delay)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(f"{i} -\n")
    return i


@afk.durable
def slow_counter(ctx: afk.RunContext, out: str, n: int = 6, delay: float = 0.2) -> int:
    """Like ``counter``, but the time is spent inside a non-idempotent step."""
    ctx.state.setdefault("sum", 0)
    for i in ctx.iterate(range(n), progress=False):
        print(f"start {i}", flush=True)
        ctx.state["sum"] += ctx.step("slow", slow_record, out, i, delay)
    return int(ctx.state["sum"])


def charge(path: str, what: str) -> str:
    """A charge that does NOT deduplicate: every line in the file is money taken."""
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(f"charged {what}\n")
    return what


@afk.durable
def two_approvals(ctx: afk.RunContext, out: str) -> list[object]:
    """Asks twice; each "yes" charges. An answer meant for one must never approve the other."""
    first = ctx.pause({"approve": "charge 1"})
    if first == "yes":
        ctx.step("charge-1", charge, out, "1")
    second = ctx.pause({"approve": "charge 2"})
    if second == "yes":
        ctx.step("charge-2", charge, out, "2")
    return [first, second]
