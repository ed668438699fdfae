"""Durable jobs for the runner tests, importable by child processes (``runner_jobs:NAME``)."""

from __future__ import annotations

import os
import time
from typing import Any

import afk_local as afk

STEPS = 50


def append_line(path: str, i: int, *, idempotency_key: str) -> int:
    """An outside side effect that deduplicates by idempotency key, like a real service."""
    with open(path, "a+", encoding="utf-8") as fh:
        fh.seek(0)
        if any(line.split()[1] == idempotency_key for line in fh.read().splitlines()):
            return i * i
        fh.write(f"{i} {idempotency_key}\n")
        fh.flush()
    return i * i


def _appender(ctx: afk.RunContext, out: str, n: int = STEPS) -> int:
    ctx.state.setdefault("total", 0)
    ctx.state.setdefault("seen", [])
    for i in range(n):
        value = ctx.step("append", append_line, out, i, idempotent=True)
        if i not in ctx.state["seen"]:
            ctx.state["total"] += value
            ctx.state["seen"].append(i)
        ctx.checkpoint()
    return int(ctx.state["total"])


def _make(mode: str) -> afk.DurableFunction[int]:
    def job(ctx: afk.RunContext, out: str, n: int = STEPS) -> int:
        return _appender(ctx, out, n)

    job.__name__ = job.__qualname__ = f"appender_{mode}"
    return afk.durable(durability=mode)(job)


appender_sync = _make("sync")
appender_async = _make("async")
appender_exit = _make("exit")
APPENDERS = {"sync": appender_sync, "async": appender_async, "exit": appender_exit}


@afk.durable
def counting_loop(ctx: afk.RunContext, n: int) -> int:
    """Prints ``start i`` as each item's body begins (after the previous item's checkpoint)."""
    ctx.state.setdefault("sum", 0)
    for i in ctx.iterate(range(n), progress=False):
        print(f"start {i}", flush=True)
        ctx.state["sum"] += i
    return int(ctx.state["sum"])


@afk.durable
def approval(ctx: afk.RunContext, amount: int) -> dict[str, Any]:
    """Asks a person before a (journaled) payment."""
    quote = ctx.step("quote", lambda a: a * 2, amount)
    answer = ctx.pause({"question": "pay?", "quote": quote})
    paid = ctx.step("pay", lambda q: f"paid {q}", quote) if answer == "yes" else None
    return {"quote": quote, "answer": answer, "paid": paid}


def log_call(path: str, name: str) -> str:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(name + "\n")
    return name


@afk.durable
def flaky(ctx: afk.RunContext, log_path: str, fail_at: int = 7) -> list[str]:
    """Raises on its first attempt at step ``fail_at``, succeeds on a later one."""
    done = []
    for i in range(1, 11):
        if i == fail_at and ctx.attempt == 1:
            raise RuntimeError(f"boom at step {i}")
        done.append(ctx.step("work", log_call, log_path, f"step{i}"))
    return done


@afk.durable
def pid_job(ctx: afk.RunContext) -> int:
    return os.getpid()


@afk.durable
def gated(ctx: afk.RunContext, gate: str) -> str:
    """Checkpoints, prints ``waiting``, then holds the run until the file ``gate`` exists."""
    ctx.checkpoint()
    print("waiting", flush=True)
    while not os.path.exists(gate):
        time.sleep(0.005)
    return "opened"


def fork_helper(store_root: str, run_id: str) -> int:
    """Forks a helper process (as daemonizing code does); the child exits once the run ended."""
    pid = os.fork()
    if pid:
        return pid
    store = afk.Store(store_root)
    deadline = time.monotonic() + 30
    while store.read_meta(run_id).status is not afk.RunStatus.COMPLETED:
        if time.monotonic() > deadline:
            break
        time.sleep(0.01)
    raise SystemExit(0)  # unwinds the inherited job's stack, then the interpreter exits


def _forking(ctx: afk.RunContext, store_root: str) -> int:
    ctx.state.setdefault("n", 0)
    for _ in ctx.iterate(range(3), progress=False):
        ctx.state["n"] += 1
    ctx.step("helper", fork_helper, store_root, ctx.run_id)
    for _ in ctx.iterate(range(3), progress=False):
        ctx.state["n"] += 1
    return int(ctx.state["n"])


def _forking_job(mode: str) -> afk.DurableFunction[int]:
    def job(ctx: afk.RunContext, store_root: str) -> int:
        return _forking(ctx, store_root)

    job.__name__ = job.__qualname__ = f"forking_{mode}"
    return afk.durable(durability=mode, flush_timeout_s=60)(job)


forking_exit = _forking_job("exit")
forking_async = _forking_job("async")
forking_sync = _forking_job("sync")
