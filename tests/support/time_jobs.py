"""Durable jobs for the durable-time tests, importable by child processes (``time_jobs:NAME``)."""

from __future__ import annotations

from pathlib import Path

import afk_local as afk
from afk_local.clock import current_clock


def clock_now() -> float:
    """The clock's time, journaled by a step: when the job got there."""
    return current_clock().time()


@afk.durable
def sleeper(ctx: afk.RunContext, seconds: float, park_after: float | None) -> float:
    """Sleep ``seconds`` (parking past ``park_after``), then journal when it woke."""
    ctx.step("before", clock_now)
    print("sleeping", flush=True)
    ctx.sleep(seconds, park_after=park_after)
    woke: float = ctx.step("woke", clock_now)
    return woke


def flaky(counter: str, failures: int) -> str:
    """Fails the first ``failures`` times it is called (counted in a file), then succeeds."""
    path = Path(counter)
    calls = int(path.read_text()) + 1 if path.exists() else 1
    path.write_text(str(calls))
    print(f"call {calls}", flush=True)
    if calls <= failures:
        raise ConnectionError(f"flaky call {calls}")
    return f"ok after {calls}"


@afk.durable
def retried(ctx: afk.RunContext, counter: str, failures: int, initial: float) -> str:
    """A step failing ``failures`` times, retried with a backoff of ``initial`` seconds."""
    policy = afk.Retry(attempts=3, initial=initial, backoff=1.0, on=(ConnectionError,))
    result: str = ctx.step("flaky", flaky, counter, failures, retry=policy)
    return result


def hold(seconds: float) -> list[float]:
    """Work under a limit: journal when it started and ended (clock time)."""
    clock = current_clock()
    start = clock.time()
    print("holding", flush=True)
    clock.sleep(seconds)
    return [start, clock.time()]


@afk.durable
def limited_worker(ctx: afk.RunContext, n: int, work: float) -> int:
    """``n`` steps under the shared ``Limit("api", concurrent=2, per_minute=30)``."""
    api = afk.Limit("api", concurrent=2, per_minute=30)
    for i in range(n):
        ctx.step("call", hold, work, limit=api)
    return n


@afk.durable
def slot_hog(ctx: afk.RunContext) -> None:
    """Takes a slot of the ``api`` limit and never gives it back (it is SIGKILLed)."""
    api = afk.Limit("api", concurrent=2, per_minute=30)
    ctx.step("hog", hold, 3600.0, limit=api)


@afk.durable
def stamp(ctx: afk.RunContext, out: str) -> str:
    """Append this run's id to ``out`` (not journaled: a second execution shows twice)."""
    with open(out, "a", encoding="utf-8") as fh:
        fh.write(f"{ctx.run_id} {ctx.attempt}\n")
    return ctx.run_id


def flaky_dies_on(counter: str, die_on: int) -> str:
    """Always fails (counted in a file); SIGKILLs its own process on call ``die_on``."""
    import os  # noqa: PLC0415
    import signal  # noqa: PLC0415

    path = Path(counter)
    calls = int(path.read_text()) + 1 if path.exists() else 1
    path.write_text(str(calls))
    if calls == die_on:
        os.kill(os.getpid(), signal.SIGKILL)
    raise ConnectionError(f"flaky call {calls}")


@afk.durable
def retried_idempotent(ctx: afk.RunContext, counter: str, die_on: int) -> str:
    """An idempotent step retried 3 times that always fails and dies during try ``die_on``."""
    policy = afk.Retry(attempts=3, initial=0.0, on=(ConnectionError,))
    result: str = ctx.step("flaky", flaky_dies_on, counter, die_on, retry=policy, idempotent=True)
    return result


@afk.durable
def slot_job(ctx: afk.RunContext) -> str | None:
    """Returns the slot its schedule started it for (ISO 8601), or None."""
    slot = ctx.scheduled_slot
    return None if slot is None else slot.isoformat()
