"""Durable sleeps and retry backoffs survive SIGKILL: a resume waits only the rest.

Real child processes, real clock (these are the wall-clock claims); the assertions
are on the times the runs recorded (journaled due times, journaled wake-ups), never
on how long the test took.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import time_jobs
from proc import REPO, SUPPORT, kill_after, spawn

import afk_local as afk
from afk_local.storage.format.records import Effect
from afk_local.testing import run_and_kill

ENV = {
    "PYTHONPATH": os.pathsep.join(
        p for p in (str(SUPPORT), str(REPO), os.environ.get("PYTHONPATH", "")) if p
    )
}
JOB_SCRIPT = """
import json, sys
import time_jobs
job = getattr(time_jobs, sys.argv[1]).with_store(sys.argv[2])
print(job.run(*json.loads(sys.argv[4]), run_id=sys.argv[3]), flush=True)
"""


def start_job(root: Path, job: str, run_id: str, *args: object):
    """A child process running ``time_jobs.<job>(*args)`` as run ``run_id``."""
    return spawn(JOB_SCRIPT, job, str(root), run_id, json.dumps(list(args)), env=ENV)


def wait_for_effect(store: afk.Store, run_id: str, key: str) -> Effect:
    """Poll the run's journal until ``key`` has an outcome; return it."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if store.exists(run_id):
            for effect in store.open(run_id).effects():
                if effect.key == key and effect.kind == "outcome":
                    return effect
        time.sleep(0.02)
    raise AssertionError(f"{run_id}: no outcome for {key}")


def outcome(store: afk.Store, run_id: str, key: str) -> Effect:
    (found,) = [e for e in store.open(run_id).effects() if e.key == key and e.kind == "outcome"]
    return found


def test_killed_during_a_5s_sleep_wakes_at_the_original_due_time(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = afk.Store(root)
    child = start_job(root, "sleeper", "nap", 5.0, None)
    due_ms = wait_for_effect(store, "nap", "@sleep#1").result
    # one second into the sleep (any moment inside it would do)
    killed = kill_after(child, seconds=max(due_ms / 1000 - 4.0 - time.time(), 0.0))
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    resumed_at = time.time()
    assert resumed_at < due_ms / 1000  # still inside the sleep: the rest is owed

    woke = time_jobs.sleeper.with_store(store).run(run_id="nap")

    assert outcome(store, "nap", "@sleep#1").result == due_ms  # decided once
    assert abs(woke - due_ms / 1000) <= 0.5  # the original due time, not 5 s after the resume
    assert woke == outcome(store, "nap", "woke#1").result


def test_step_failing_twice_killed_during_its_backoff_resumes_with_the_rest(
    tmp_path: Path,
) -> None:
    root, counter = tmp_path / "store", tmp_path / "calls"
    store = afk.Store(root)
    child = start_job(root, "retried", "flaky", str(counter), 2, 2.0)
    backoff_due = wait_for_effect(store, "flaky", "flaky#1@retry1").result
    killed = kill_after(child, seconds=0.3)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert counter.read_text() == "1"  # killed in the first backoff, before the 2nd try

    result = time_jobs.retried.with_store(store).run(run_id="flaky")

    assert result == "ok after 3"
    records = [e for e in store.open("flaky").effects() if e.key == "flaky#1"]
    intents = [e for e in records if e.kind == "intent"]
    outcomes = [e.status for e in records if e.kind == "outcome"]
    assert len(intents) == 3 and outcomes == ["error", "error", "ok"]
    # the 2nd try waited for the backoff due time the killed process journaled, no longer
    assert outcome(store, "flaky", "flaky#1@retry1").result == backoff_due
    assert backoff_due <= intents[1].timestamp_ms <= backoff_due + 500
    second_due = outcome(store, "flaky", "flaky#1@retry2").result
    assert second_due <= intents[2].timestamp_ms <= second_due + 500


def test_a_retried_step_killed_during_its_last_try_runs_no_more_tries(tmp_path: Path) -> None:
    """Every started try counts against ``attempts``, the one in doubt included."""
    root, counter = tmp_path / "store", tmp_path / "calls"
    store = afk.Store(root)
    job = time_jobs.retried_idempotent.with_store(store)

    killed = run_and_kill(job, str(counter), 3, at=None, store=store, run_id="r")
    assert killed.returncode == -signal.SIGKILL and counter.read_text() == "3"

    with pytest.raises(afk.EffectInDoubtError) as in_doubt:
        job.run(run_id="r")
    assert in_doubt.value.key == "flaky#1"
    assert counter.read_text() == "3"  # not 6: the round of 3 tries was used up


def test_a_retried_step_killed_during_an_earlier_try_finishes_its_round(tmp_path: Path) -> None:
    root, counter = tmp_path / "store", tmp_path / "calls"
    store = afk.Store(root)
    job = time_jobs.retried_idempotent.with_store(store)

    killed = run_and_kill(job, str(counter), 2, at=None, store=store, run_id="r")
    assert killed.returncode == -signal.SIGKILL and counter.read_text() == "2"

    with pytest.raises(ConnectionError, match="flaky call 3"):
        job.run(run_id="r")
    assert counter.read_text() == "3"  # the in-doubt try 2 counted; one more try, not two
