"""kill_sweep over the features that run user code: 0 wrong endings at the sampled points.

Each sweep runs its job once uninterrupted, then kills a child at sampled durable I/O
calls (every call, and a second kill during the resume, under ``--torture``) and
resumes it by ``afk-local resume``, ``watch --once`` and the same call in turn. The
jobs are in tests/support/sweep_jobs.py; their effects go to the sweep's effect log.
"""

from __future__ import annotations

import pytest
import sweep_jobs

from afk_local.clock import ScaledClock
from afk_local.testing import SweepResult, kill_sweep


@pytest.mark.parametrize("job", ["charges_sync", "charges_async", "charges_exit"])
def test_durable_jobs_of_each_durability_end_as_uninterrupted(kill_sweep, job: str) -> None:
    swept: SweepResult = kill_sweep(getattr(sweep_jobs, job), 3).check()
    assert swept.result == ["receipt 0", "receipt 1", "receipt 2"]
    assert swept.effects == ("charge 0", "charge 1", "charge 2")
    assert any(t.killed for t in swept.trials)  # async: the last calls may not come


def test_an_async_def_job_ends_as_uninterrupted(kill_sweep) -> None:
    swept = kill_sweep(sweep_jobs.charges_coroutine, 2).check()
    assert swept.result == ["receipt 0", "receipt 1"]


def test_a_state_checkpoint_loop_ends_as_uninterrupted(kill_sweep) -> None:
    # a plain loop: only calling it again resumes it (no entrypoint for the CLI)
    swept = kill_sweep("sweep_jobs:state_loop", 4, run_id="state", resumes=("call",)).check()
    assert swept.result == 0 + 1 + 4 + 9


def test_a_retried_step_ends_as_uninterrupted(kill_sweep) -> None:
    swept = kill_sweep(sweep_jobs.retried_charge, 2).check()
    assert swept.result == "receipt 1"
    assert swept.effects == ("try 1 #1", "try 1 #2", "try 1 #3")


def test_a_parked_sleep_ends_as_uninterrupted(kill_sweep) -> None:
    clock = ScaledClock(1000.0)  # the 30 s sleep parks, and is due 30 ms later
    swept = kill_sweep(sweep_jobs.sleepy_charges, 30.0, env=clock.env()).check()
    assert swept.result == ["receipt 1", "receipt 2"]


def test_steps_under_a_limit_end_as_uninterrupted(kill_sweep) -> None:
    swept = kill_sweep(sweep_jobs.limited_charges, 2).check()
    assert swept.result == ["receipt 0", "receipt 1"]


def _without_replay_count(result: dict) -> dict:
    return {k: v for k, v in result.items() if k != "replayed_effect_count"}


def test_an_agent_runner_run_ends_as_uninterrupted(kill_sweep) -> None:
    swept = kill_sweep("sweep_jobs:agent_run", 2, compare=_without_replay_count).check()
    assert swept.result["final_text"] == "charged 2 orders"
    assert swept.effects.count("model asked 1") == 1


def test_the_sweep_finds_an_effect_outside_any_step(tmp_path) -> None:
    # the bug a sweep is for: the charge is not journaled, so a resume repeats it
    swept = kill_sweep(sweep_jobs.forgetful, 3, sample=3, seed=1, workdir=tmp_path / "w")
    repeated = [t for t in swept.wrong if "more often" in t.ending]
    assert repeated, swept.trials
    with pytest.raises(AssertionError, match="ended wrong"):
        swept.check()


def test_an_effect_in_doubt_is_a_right_ending_and_a_pair_of_kills_is_swept(tmp_path) -> None:
    swept = kill_sweep(
        sweep_jobs.charges_sync, 2, pairs=True, sample=2, seed=3, workdir=tmp_path / "w"
    ).check()
    assert {t.ending for t in swept.trials} <= {"same", "in doubt"}
    assert any(t.then is not None for t in swept.trials)


def test_a_langgraph_thread_on_the_saver_ends_as_uninterrupted(kill_sweep) -> None:
    pytest.importorskip(
        "langgraph", reason="LangGraph not installed: pip install 'afk_local[test]'"
    )
    swept = kill_sweep("sweep_jobs:graph_run", 3, resumes=("call",)).check()
    assert swept.status == "returned"
    assert swept.result == {"count": 3, "log": ["effect 1", "effect 2", "effect 3"]}
    assert swept.effects == ("node 1", "node 2", "node 3")


def test_a_dask_fan_out_ends_as_uninterrupted(kill_sweep) -> None:
    pytest.importorskip("distributed", reason="Dask not installed: pip install 'afk_local[dask]'")
    swept = kill_sweep("sweep_jobs:fan_out", 2, resumes=("call",), timeout=120).check()
    assert swept.result == ["receipt 0", "receipt 1"]


def test_a_scheduled_slot_runs_once_whatever_the_kill(kill_sweep) -> None:
    # the schedule written, the slot's run made, the mark moved, the run run: killed
    # anywhere, the slot's one run ends as uninterrupted and charges once
    run_id = "tick--19700211T170000Z"
    swept = kill_sweep("sweep_jobs:scheduled_tick", run_id=run_id, resumes=("call", "resume"))
    assert swept.check().result == f"receipt {int(sweep_jobs.HOUR_1001)}"
    assert swept.effects == (f"charge {int(sweep_jobs.HOUR_1001)}",)
