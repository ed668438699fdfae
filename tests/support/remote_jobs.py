"""Jobs and scripts for the remote-mirror tests, run in child processes (``remote_jobs:NAME``)."""

from __future__ import annotations

import os
import time

import afk_local as afk


def record_call(path: str, i: int) -> int:
    """A side effect that does NOT deduplicate: every execution adds a line."""
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(f"{i}\n")
        fh.flush()
        os.fsync(fh.fileno())
    return i * i


def _stall_if_asked(i: int) -> None:
    # The test SIGKILLs the child while it waits here: item i's call has run and its
    # outcome is journaled, but the item is not checkpointed as done, so a resume runs
    # the item again and only the journal keeps the call from running twice.
    if os.environ.get("REMOTE_JOB_STALL_AT") == str(i):
        print(f"stalled {i}", flush=True)
        time.sleep(600)


@afk.durable
def effects_job(ctx: afk.RunContext, out: str, n: int) -> int:
    """One journaled, non-idempotent call and one checkpoint per item; prints ``done i``."""
    ctx.state.setdefault("total", 0)
    for i in ctx.iterate(range(n), progress=False):
        ctx.state["total"] += ctx.step("record", record_call, out, i)
        _stall_if_asked(i)
        print(f"done {i}", flush=True)
    return int(ctx.state["total"])
