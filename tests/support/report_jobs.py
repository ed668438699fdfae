"""Durable jobs that report progress, metrics and tags (``report_jobs:NAME`` for children).

With ``REPORT_JOBS_ACK`` set, ``metered`` prints one line per finished item so a
crash test can SIGKILL it between items.
"""

from __future__ import annotations

import os
import sys

import afk_local as afk
from afk_local.runner.run.durable_function import durable

FAIL_AT: list[int] = []  # items at which metered raises, once each


def square(i: int) -> int:
    return i * i


@durable
def metered(ctx: afk.RunContext, n: int) -> int:
    """n items, each one journaled step and two metrics; returns the sum of squares."""
    ctx.state.setdefault("total", 0)
    for i in ctx.iterate(range(n), progress=False):
        if i in FAIL_AT:
            FAIL_AT.remove(i)
            ctx.step("flaky", _boom, i)
        # pure: a kill inside it (the parent kills between acks, but the child may have
        # begun the next item) leaves it safe to run again
        ctx.state["total"] += ctx.step("square", square, i, idempotent=True)
        ctx.metric("loss", 1.0 / (i + 1))
        ctx.metric("item", i)
        if os.environ.get("REPORT_JOBS_ACK"):
            sys.stdout.write(f"item {i}\n")
            sys.stdout.flush()
    return int(ctx.state["total"])


def _boom(i: int) -> None:
    raise ValueError(f"item {i} broke")


@durable
def declared(ctx: afk.RunContext, n: int) -> int:
    """Declares its size with ctx.progress and counts steps, no loop."""
    ctx.progress(total=n)
    done = 0
    for i in range(n):
        done += ctx.step("square", square, i)
    ctx.tags["phase"] = "finished"
    return done
