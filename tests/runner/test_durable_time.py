"""ctx.sleep, ctx.sleep_until and retried steps on the time-skipping clock (in-process).

The crash behaviour (SIGKILL during a sleep or a backoff) is in test_durable_time_crash.py;
here the clock skips, so an hour-long sleep returns at once and the tests check
what was journaled and when the clock says things happened.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
import time_jobs

import afk_local as afk
from afk_local.runner.time.retry import Retry
from afk_local.storage.format.records import RunStatus
from afk_local.testing import SkippingClock


def _effects(store: afk.Store, run_id: str, key_prefix: str) -> list[afk.Effect]:
    return [e for e in store.open(run_id).effects() if e.key.startswith(key_prefix)]


def test_a_short_sleep_waits_on_the_clock_and_journals_its_due_time(
    afk_store: afk.Store, afk_clock: SkippingClock
) -> None:
    start = afk_clock.time()
    job = time_jobs.sleeper.with_store(afk_store)

    woke = job.run(30.0, None, run_id="s1")

    assert afk_clock.slept == pytest.approx(30.0, abs=0.01)
    sleep = _effects(afk_store, "s1", "@sleep")
    assert [e.kind for e in sleep] == ["intent", "outcome"]
    due_ms = sleep[1].result
    assert due_ms == pytest.approx((start + 30.0) * 1000, abs=5)
    assert woke >= due_ms / 1000


def test_a_long_sleep_parks_the_run_and_a_resume_after_wake_at_finishes_it(
    afk_store: afk.Store, afk_clock: SkippingClock
) -> None:
    start = afk_clock.time()
    job = time_jobs.sleeper.with_store(afk_store)

    with pytest.raises(afk.RunSleeping) as parked:
        job.run(3600.0, 60.0, run_id="s2")

    meta = afk_store.read_meta("s2")
    assert meta.status is RunStatus.SLEEPING
    assert meta.wake_at_ms == parked.value.wake_at_ms
    assert meta.wake_at_ms == pytest.approx((start + 3600) * 1000, abs=5)
    assert afk_clock.slept == 0  # parked, not waited
    (info,) = [r for r in afk_store.runs() if r.run_id == "s2"]
    assert info.status is RunStatus.SLEEPING and not info.interrupted

    # resumed too early (someone ran `afk-local resume`): it parks again, same due time
    afk_clock.advance(1000)
    with pytest.raises(afk.RunSleeping) as again:
        job.run(run_id="s2")
    assert again.value.wake_at_ms == meta.wake_at_ms

    afk_clock.advance(2600)  # the laptop slept through the rest: it counts as waited
    woke = job.run(run_id="s2")
    assert woke >= meta.wake_at_ms / 1000
    after = afk_store.read_meta("s2")
    assert after.status is RunStatus.COMPLETED and after.wake_at_ms == 0
    # one due time in the journal, whatever the number of attempts
    assert [e.kind for e in _effects(afk_store, "s2", "@sleep")] == ["intent", "outcome"]


def test_sleep_until_keeps_the_first_attempts_due_time(
    afk_store: afk.Store, afk_clock: SkippingClock
) -> None:
    base = afk_clock.time()
    seen: list[float] = []

    @afk.durable(store=afk_store)
    def until(ctx: afk.RunContext) -> None:
        # a `when` computed from "now" differs on every attempt: the journaled one wins
        ctx.sleep_until(dt.datetime.fromtimestamp(afk_clock.time() + 7200), park_after=60)
        seen.append(afk_clock.time())

    with pytest.raises(afk.RunSleeping) as parked:
        until.run(run_id="u1")
    assert parked.value.wake_at_ms == pytest.approx((base + 7200) * 1000, abs=5)
    afk_clock.advance(7200)
    until.run(run_id="u1")
    assert seen and seen[0] == pytest.approx(base + 7200, abs=0.01)


def test_a_clock_stepped_back_lengthens_the_wait_to_the_calendar_due_time(
    afk_store: afk.Store, afk_clock: SkippingClock
) -> None:
    job = time_jobs.sleeper.with_store(afk_store)
    with pytest.raises(afk.RunSleeping) as parked:
        job.run(600.0, 60.0, run_id="s3")
    afk_clock.set(afk_clock.time() - 3600)  # the wall clock was stepped back an hour
    with pytest.raises(afk.RunSleeping) as again:
        job.run(run_id="s3")
    assert again.value.wake_at_ms == parked.value.wake_at_ms


def test_a_step_failing_twice_is_retried_with_journaled_tries_and_backoffs(
    afk_store: afk.Store, afk_clock: SkippingClock, tmp_path: Path
) -> None:
    job = time_jobs.retried.with_store(afk_store)

    assert job.run(str(tmp_path / "calls"), 2, 10.0, run_id="r1") == "ok after 3"

    tries = _effects(afk_store, "r1", "flaky#1")
    flaky = [e for e in tries if e.key == "flaky#1"]
    assert [(e.kind, e.status) for e in flaky] == [
        ("intent", None),
        ("outcome", "error"),
        ("intent", None),
        ("outcome", "error"),
        ("intent", None),
        ("outcome", "ok"),
    ]
    assert all(e.error.type == "ConnectionError" for e in flaky if e.status == "error")
    backoffs = sorted({e.key for e in tries if e.key != "flaky#1"})
    assert backoffs == ["flaky#1@retry1", "flaky#1@retry2"]
    assert afk_clock.slept == pytest.approx(20.0, abs=0.01)


def test_exhausted_tries_raise_the_last_error_and_a_restart_gets_a_new_round(
    afk_store: afk.Store, afk_clock: SkippingClock, tmp_path: Path
) -> None:
    job = time_jobs.retried.with_store(afk_store)
    counter = str(tmp_path / "calls")

    with pytest.raises(ConnectionError, match="flaky call 3"):
        job.run(counter, 4, 1.0, run_id="r2")
    assert afk_store.read_meta("r2").status is RunStatus.FAILED

    assert job.run(run_id="r2") == "ok after 5"  # a retry of the failed run: 3 more tries
    flaky = [e for e in afk_store.open("r2").effects() if e.key == "flaky#1"]
    assert [e.status for e in flaky if e.kind == "outcome"] == ["error"] * 4 + ["ok"]


def test_errors_not_in_on_are_not_retried(afk_store: afk.Store, afk_clock: SkippingClock) -> None:
    calls: list[int] = []

    def broken() -> None:
        calls.append(1)
        raise KeyError("no")

    @afk.durable(store=afk_store)
    def job(ctx: afk.RunContext) -> None:
        ctx.step("broken", broken, retry=Retry(5, on=(ConnectionError,)))

    with pytest.raises(KeyError):
        job.run(run_id="r3")
    assert calls == [1] and afk_clock.slept == 0


def test_retry_delays_grow_to_the_cap_and_accept_a_tenacity_wait() -> None:
    policy = Retry(6, initial=1.0, backoff=3.0, max_delay=20.0)
    assert [policy.delay(n) for n in range(1, 5)] == [1.0, 3.0, 9.0, 20.0]
    jittered = Retry(initial=10.0, jitter=0.5)
    assert all(10.0 <= jittered.delay(1) <= 15.0 for _ in range(50))
    tenacity = pytest.importorskip("tenacity", reason="Retry(wait=) needs the retry extra")
    incrementing = Retry(wait=tenacity.wait_incrementing(start=2, increment=5))
    assert [incrementing.delay(n) for n in (1, 2, 3)] == [2.0, 7.0, 12.0]
    with pytest.raises(ValueError, match="attempts"):
        Retry(0)
    with pytest.raises(TypeError, match="exception types"):
        Retry(on=(int,))  # type: ignore[arg-type]


def test_an_async_job_sleeps_and_parks_like_a_sync_one(
    afk_store: afk.Store, afk_clock: SkippingClock
) -> None:
    @afk.durable(store=afk_store)
    async def nap(ctx: afk.RunContext) -> float:
        await ctx.asleep(30)
        await ctx.asleep_until(afk_clock.time() + 3600, park_after=60)
        return afk_clock.time()

    with pytest.raises(afk.RunSleeping) as parked:
        nap.run(run_id="a1")
    assert afk_clock.slept == pytest.approx(30, abs=0.01)
    afk_clock.advance(3600)
    assert nap.run(run_id="a1") >= parked.value.wake_at_ms / 1000
