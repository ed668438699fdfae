"""The explorer's operation workloads (status changes, answers, tags, removal, keyed heads,
a clock that steps, the watcher's bookkeeping) and those of the store's own files
(schedules, limits, requests, adopt): every crash state recovers, head records included.

The default run explores each with a small budget and today's explorer seed
(``AFK_EXPLORER_SEED``); ``--torture`` every state, with many seeds.
"""

from __future__ import annotations

import pytest

from afk_local.testing.crashsim import explore
from afk_local.testing.crashsim.report import counterexample_text
from afk_local.testing.crashsim.suites.edits import EDIT_WORKLOADS
from afk_local.testing.crashsim.suites.operations import OPERATION_WORKLOADS
from afk_local.testing.crashsim.suites.store_files import STORE_FILE_WORKLOADS

DEFAULT_STATES = 60
"""Default suite: crash states per operation workload (most have fewer in all; --torture:
every one)."""

SMALL_STATES = {"answer": 20, "tags": 20}
"""Default suite: a smaller draw for workloads whose every state resumes a job (--torture:
every state)."""


@pytest.mark.parametrize(
    "workload", [w.name for w in (*OPERATION_WORKLOADS, *EDIT_WORKLOADS, *STORE_FILE_WORKLOADS)]
)
def test_every_crash_state_of_every_operation_recovers(
    workload: str, full: bool, explorer_seeds: list[int]
) -> None:
    budgets = [(None, explorer_seeds[0])] if full else []  # --torture: every state once
    states = SMALL_STATES.get(workload, DEFAULT_STATES)
    budgets += [(states, seed) for seed in explorer_seeds]  # then each seed's draw
    for max_states, seed in budgets:
        result = explore(workload, max_states=max_states, seed=seed)
        assert result.ok, f"seed {seed}: {counterexample_text(result.counterexample)}"  # type: ignore[arg-type]


def test_a_completed_keyed_run_whose_clock_stepped_back_stays_completed() -> None:
    """Issue 38 item 1: the terminal checkpoint is stamped 3 s before the meta it replaces;
    a power cut that loses the meta's rename must not make the run read ``running``."""
    result = explore("clock-step-keyed", max_states=40, seed=1)
    assert result.ok, counterexample_text(result.counterexample)  # type: ignore[arg-type]


def test_a_keyed_runs_head_record_is_never_ahead_of_what_is_durable() -> None:
    """Issue 38 item 2: with a clock that stands still, the head record names a meta stamp
    that only the unsynced rename of the completed ``run.meta`` holds (old code)."""
    result = explore("sync-keyed", max_states=40, seed=1)
    assert result.ok, counterexample_text(result.counterexample)  # type: ignore[arg-type]


def test_the_meta_rm_keeps_survives_a_power_cut_after_rm_returned() -> None:
    """Issue 38 item 3: ``removed/<id>/run.meta`` was a hard link to bytes never fsynced;
    the terminal checkpoint holding its copy went with the run."""
    result = explore("rm", max_states=None, seed=1)
    assert result.ok, counterexample_text(result.counterexample)  # type: ignore[arg-type]


def test_latest_left_two_behind_by_two_kills_is_repaired_not_reported() -> None:
    """Issue 38 item 5: gc-then-pack crashed twice with the default seed (0) left ``latest``
    two checkpoints behind, and verify called it a rollback by a second writer."""
    result = explore("gc-then-pack", depth=2, seed=0)
    assert result.ok, counterexample_text(result.counterexample)  # type: ignore[arg-type]


def test_a_request_rejected_before_a_power_cut_is_not_pending_for_ever() -> None:
    """Found by the requests workload: ``reject`` moved a request to ``rejected/`` around
    the I/O seam, and a crash that kept the new name and not the removal of the old left
    one file under both; moving it again did nothing (rename(2) onto itself), so every
    sweep read it and rejected it again."""
    result = explore("requests", max_states=40, seed=1)
    assert result.ok, counterexample_text(result.counterexample)  # type: ignore[arg-type]
