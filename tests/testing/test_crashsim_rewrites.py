"""Issue 33, "the explorer crashes twice": composed rewrites, a second crash, site mutants.

- Every composed workload (gc of a packed run, gc then pack, merge, pack and gc
  interleaved with a writer, fork and export while packing) recovers from every crash
  state checked, at depth 2: the interrupted rewrite is run again in a first crash
  state and crashed in turn.
- Every fsync of the pack, merge and gc paths has a site mutant, and each site mutant
  is caught by a workload that recovers without it (the last two to be caught needed
  a keyed gc with nothing to rewrite before its first deletion, and a fork after gc
  trimmed a journal: ``gc-keyframes-keyed``, ``gc-trim-fork``).

Before the run's MANIFEST (issue 33), gc-packed, gc-then-pack (both keyed and not)
and live-pack-gc found counterexamples here: a killed gc of a packed run, then gc
again, lost the newest acknowledged checkpoint. Default: the bounded budget;
``--torture``: every first crash state rerun, no budget.
"""

from __future__ import annotations

import pytest

from afk_local.testing.crashsim import WORKLOADS, explore
from afk_local.testing.crashsim.explorer import DEFAULT_MAX_STATES
from afk_local.testing.crashsim.hunt import fsync_sites, hunt_mutant
from afk_local.testing.crashsim.mutants import (
    FAULT_SITES,
    LANGGRAPH_SITES,
    OPERATION_SITES,
    OUTSIDE_SITES,
    REMOTE_SITES,
    REWRITE_MODULES,
    SITE_MUTANTS,
)
from afk_local.testing.crashsim.report import counterexample_text, hunt_line
from afk_local.testing.crashsim.suites.rewrites import REWRITE_WORKLOADS


@pytest.mark.parametrize("workload", [w.name for w in REWRITE_WORKLOADS])
def test_composed_rewrites_recover_after_crashing_twice(
    workload: str, full: bool, explorer_seeds: list[int]
) -> None:
    """With today's seed (printed in the header; AFK_EXPLORER_SEED replays it), and under
    ``--torture`` many: a pinned seed once hid a counterexample of the default one."""
    budgets: list[tuple[int | None, int | None, int]] = [(None, None, explorer_seeds[0])]
    budgets = budgets if full else []  # --torture: every state once, then the seeds
    budgets += [(DEFAULT_MAX_STATES, 4, seed) for seed in explorer_seeds]
    for max_states, second_crashes, seed in budgets:
        result = explore(
            workload,
            max_states=max_states,
            depth=2,
            second_crashes=second_crashes,
            seed=seed,
        )
        found = result.counterexample
        assert found is None, f"seed {seed}: {counterexample_text(found)}"
        assert result.first_states_rerun >= 1  # the rerun was recorded in first crash states
        assert result.second_states >= result.first_states_rerun


def test_every_composed_workload_can_crash_twice() -> None:
    assert len(REWRITE_WORKLOADS) >= 8
    assert all(w.rerun is not None for w in REWRITE_WORKLOADS)
    assert {w.name for w in REWRITE_WORKLOADS} <= set(WORKLOADS)


def test_every_fsync_of_pack_merge_and_gc_has_a_site_mutant() -> None:
    """A new fsync in a rewrite path must get a mutant; a mutant must still name an fsync
    (every module: tests/testing/test_crashsim_sites.py)."""
    seen: set[tuple[str, str]] = set()
    for workload in REWRITE_WORKLOADS:
        seen |= set(fsync_sites(workload))
    rewrite = {s for s in seen if s[0].partition(".")[0] in REWRITE_MODULES}
    assert rewrite, "no workload makes an fsync in the rewrite paths"
    assert rewrite <= set(SITE_MUTANTS.values()), sorted(rewrite - set(SITE_MUTANTS.values()))


HUNT_STATES = 60
"""Default suite: states per workload when hunting a site mutant (every catch on main
comes within 60; ``--torture`` has no budget)."""

_SITES: dict[str, dict[tuple[str, str], int]] = {}
_BASELINES: dict[str, bool] = {}


_HUNTED_ELSEWHERE = {
    *OPERATION_SITES,
    *OUTSIDE_SITES,
    *REMOTE_SITES,
    *FAULT_SITES,
    *LANGGRAPH_SITES,
}
"""Sites whose mutants their own test files hunt (test_crashsim_sites.py, _outside.py,
_faults.py, _langgraph.py; the subsumed ones among them are checked to survive there)."""


@pytest.mark.parametrize(
    "mutant", [m for m, site in SITE_MUTANTS.items() if site not in _HUNTED_ELSEWHERE]
)
def test_each_site_mutant_is_caught_by_a_workload_that_recovers_without_it(
    mutant: str, full: bool
) -> None:
    found = hunt_mutant(
        mutant,
        max_states=None if full else HUNT_STATES,
        sites=_SITES,
        baselines=_BASELINES,
    )
    assert found.caught is not None, hunt_line(found)
    caught = found.caught.counterexample
    assert caught is not None and caught.ignored  # what the mutant removed before the crash
    assert caught.problems
