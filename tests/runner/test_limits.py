"""afk.Limit across real processes: never more than N at once nor M starts a minute.

Eight worker processes share ``Limit("api", concurrent=2, per_minute=30)`` on a
:class:`~afk_local.clock.ScaledClock` (20x: a minute is 3 real seconds), so
the per-minute window really binds; the measurements come from their journals
(when each call got its place, as the limit counted it, and when it ended), never
from the test's own timing.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from filelock import FileLock
from proc import REPO, SUPPORT, kill_after, spawn

import afk_local as afk
from afk_local.clock import ScaledClock
from afk_local.runner.time.limits import Limit
from afk_local.storage.format.records import RunStatus

JOB_SCRIPT = """
import json, sys
import time_jobs
job = getattr(time_jobs, sys.argv[1]).with_store(sys.argv[2])
print(job.run(*json.loads(sys.argv[4]), run_id=sys.argv[3]), flush=True)
"""
WORKERS, CALLS = 8, 5


def env(clock: ScaledClock | None = None) -> dict[str, str]:
    path = os.pathsep.join(
        p for p in (str(SUPPORT), str(REPO), os.environ.get("PYTHONPATH", "")) if p
    )
    return {"PYTHONPATH": path, **(clock.env() if clock else {})}


def start(root: Path, job: str, run_id: str, *args: object, clock: ScaledClock | None = None):
    return spawn(JOB_SCRIPT, job, str(root), run_id, json.dumps(list(args)), env=env(clock))


def limited_calls(store: afk.Store, run_id: str) -> list[tuple[float, float]]:
    """(got its place, ended) of every limited call of a run, in clock seconds."""
    effects = store.open(run_id).effects()
    placed = {
        e.key.removesuffix("@limit"): e.result["started_ms"] / 1000
        for e in effects
        if e.key.endswith("@limit") and e.kind == "outcome"
    }
    ended = {e.key: e.result[1] for e in effects if e.kind == "outcome" and e.key in placed}
    return [(placed[key], ended[key]) for key in sorted(ended)]


def most_at_once(calls: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in calls] + [(e, -1) for _, e in calls])
    running = peak = 0
    for _, change in events:  # an end sorts before a start at the same instant
        running += change
        peak = max(peak, running)
    return peak


def test_eight_processes_stay_under_the_limit_and_a_killed_holder_leaks_no_slot(
    tmp_path: Path,
) -> None:
    root = tmp_path / "store"
    store = afk.Store(root)
    clock = ScaledClock(20.0)
    hog = start(root, "slot_hog", "hog", clock=clock)
    assert hog.stdout is not None
    assert hog.stdout.readline().strip() == "holding"  # it holds a slot now
    killed = kill_after(hog, seconds=0)
    assert killed.returncode == -signal.SIGKILL

    workers = [
        start(root, "limited_worker", f"w{i}", CALLS, 1.0, clock=clock) for i in range(WORKERS)
    ]
    for proc in workers:
        _out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err

    calls = [c for i in range(WORKERS) for c in limited_calls(store, f"w{i}")]
    assert len(calls) == WORKERS * CALLS
    # never more than 2 at once, and 2 at once did happen: the dead hog's slot came back
    assert most_at_once(calls) == 2
    starts = sorted(s for s, _ in calls)
    for i, first in enumerate(starts):
        in_window = sum(1 for s in starts[i:] if s < first + 60.0)
        assert in_window <= 30, (first, in_window)
    # 40 starts cannot fit one minute: the rate limit made some wait for the next one
    assert starts[-1] - starts[0] >= 59.0


def test_a_step_waiting_for_a_slot_is_visible_in_show(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = afk.Store(root)
    slots = root / "limits" / "api"
    slots.mkdir(parents=True)
    held = [FileLock(str(slots / f"slot-{i}.lock"), timeout=0) for i in range(2)]
    for lock in held:
        lock.acquire()
    waiter = start(root, "limited_worker", "waiter", 1, 0.0)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline, "the step never showed as waiting"
            if store.exists("waiter"):
                waiting = store.read_meta("waiter").extra.get("waiting")
                if waiting:
                    break
            time.sleep(0.05)
        assert waiting["limit"] == "api" and waiting["for"] == "slot"
        assert waiting["step"] == "call#1"
        assert store.read_meta("waiter").status is RunStatus.RUNNING
    finally:
        for lock in held:
            lock.release()
    _out, err = waiter.communicate(timeout=60)
    assert waiter.returncode == 0, err
    assert "waiting" not in store.read_meta("waiter").extra


def test_limit_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="concurrent"):
        Limit("api")
    with pytest.raises(ValueError, match="Limit name"):
        Limit("../etc", concurrent=1)
    with pytest.raises(ValueError, match="per_minute"):
        Limit("api", per_minute=0)


def test_the_rate_window_waits_on_the_skipping_clock(afk_store: afk.Store, afk_clock) -> None:
    seen: list[float] = []

    @afk.durable(store=afk_store)
    def burst(ctx: afk.RunContext) -> None:
        api = Limit("burst", per_minute=3)
        for _ in range(7):
            ctx.step("call", lambda: seen.append(afk_clock.time()), limit=api)

    start = afk_clock.time()
    burst.run(run_id="b")
    # 3 at once, 3 a minute later, 1 two minutes later: no test time spent waiting
    assert [round((t - start) / 60) for t in seen] == [0, 0, 0, 1, 1, 1, 2]
