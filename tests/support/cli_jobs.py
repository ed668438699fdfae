"""Durable jobs that CLI, fork and retention tests resume from other processes.

Importable as ``cli_jobs`` (tests/ is on sys.path under pytest; children get it
through PYTHONPATH), so a run's entrypoint ``cli_jobs:count_job`` resolves anywhere.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import afk_local as afk
from afk_local.runner.run.durable_function import durable

FAIL_AT: list[int] = []  # item indexes at which count_job raises (one-shot)


def append_line(path: str, item: int, *, idempotency_key: str) -> int:
    """An outside side effect, deduplicated by idempotency key like a real service."""
    target = Path(path)
    if target.exists() and idempotency_key in target.read_text("utf-8").split():
        return item * item
    with open(target, "a", encoding="utf-8") as fh:
        fh.write(f"{item} {idempotency_key}\n")  # no fsync: these tests kill processes, not power
    return item * item


@durable
def count_job(ctx: afk.RunContext, n: int, outside: str) -> int:
    """Sum of squares over ``n`` items, each item one journaled side effect."""
    ctx.state.setdefault("total", 0)
    for item in ctx.iterate(range(n), progress=False):
        if item in FAIL_AT:
            FAIL_AT.remove(item)
            raise RuntimeError(f"planned failure at item {item}")
        ctx.state["total"] += ctx.step("append", append_line, outside, item, idempotent=True)
        if os.environ.get("CLI_JOBS_ACK"):  # the crash tests read one line per item
            sys.stdout.write(f"item {item}\n")
            sys.stdout.flush()
    return int(ctx.state["total"])


@durable
def loop_job(ctx: afk.RunContext, n: int, fail_at: int) -> int:
    """``n`` loop items and no journaled step; raises at item ``fail_at`` (-1: never)."""
    for item in ctx.iterate(range(n), progress=False):
        if item == fail_at:
            raise RuntimeError(f"planned failure at item {item}")
    return n


@durable
def ask_job(ctx: afk.RunContext, question: str) -> dict[str, object]:
    """Pauses for an answer, then returns it."""
    answer = ctx.pause({"question": question})
    return {"question": question, "answer": answer}


def charge(outside: str, amount: int) -> str:
    """A side effect that is not idempotent; with CLI_JOBS_DIE_IN_STEP the process dies
    right after it, before its outcome is journaled: the call is left in doubt."""
    with open(outside, "a", encoding="utf-8") as fh:
        fh.write(f"charged {amount}\n")
    if os.environ.get("CLI_JOBS_DIE_IN_STEP"):
        os.kill(os.getpid(), signal.SIGKILL)
    return f"receipt-{amount}"


@durable
def charge_job(ctx: afk.RunContext, outside: str, amount: int) -> dict[str, object]:
    """One journaled charge, not idempotent: a crash inside it leaves it in doubt."""
    return {"receipt": ctx.step("charge", charge, outside, amount)}


def card_charge(path: str, n: int) -> str:
    """A side effect that does NOT deduplicate (a card charge): running it twice shows."""
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(f"charge {n}\n")
    return f"receipt {n}"


@durable
def charges_then_failure(ctx: afk.RunContext, charges: str, flag: str) -> list[str]:
    """Four journaled charges, then a failure on the first attempt; a retry finishes.

    The retry must replay the four charges from the journal: the outside file
    shows every charge that really ran.
    """
    receipts = [ctx.step("charge", card_charge, charges, n) for n in range(1, 5)]
    if not os.path.exists(flag):
        Path(flag).touch()
        raise RuntimeError("the shipping service is down; retry later")
    return receipts


def expected_total(n: int) -> int:
    """What count_job returns for ``n`` items."""
    return sum(i * i for i in range(n))
