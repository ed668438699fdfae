"""The explorer's workloads of the LangGraph saver (crashsim.suites.langgraph).

- Every crash state recovers, in a plain and in a keyed store: acknowledged checkpoints
  and pending writes are listed by a new saver, a deleted thread stays deleted, deleted
  checkpoints are never listed, and every listing agrees with the checkpoint files.
  Default suite: a small draw with today's explorer seed (``AFK_EXPLORER_SEED``);
  ``--torture``: every state, then many seeds.
- Each of the saver's site mutants (``LANGGRAPH_SITES``) is caught, except the subsumed
  ones (``SUBSUMED_SITES``), which survive (default: one of them a day, with a budget;
  ``--torture``: each, every state).
"""

from __future__ import annotations

import random

import pytest
from conftest import EXPLORER_SEED

from afk_local.testing.crashsim import explore
from afk_local.testing.crashsim.mutants import LANGGRAPH_SITES, SUBSUMED_SITES
from afk_local.testing.crashsim.report import counterexample_text


@pytest.fixture(autouse=True)
def _needs_langgraph() -> None:
    """The tests need langgraph: imported as they run, not as every worker collects the module."""
    pytest.importorskip(
        "langgraph", reason="LangGraph not installed: pip install 'afk_local[test-all]'"
    )


DEFAULT_STATES = 20
"""Default suite: crash states per draw (--torture: every one)."""

CAUGHT_BY = {
    ("index.record_deletions", "journal"): "langgraph",  # the keyed store trusts no cache
    ("writes.rewrite_writes", "file"): "langgraph",
    ("writes.append_writes", "journal"): "langgraph",
    ("writes.open_writes", "dir"): "langgraph",
}
"""The workload that catches each of the saver's site mutants that must be caught."""


@pytest.mark.parametrize("workload", ["langgraph", "langgraph-keyed"])
def test_every_crash_state_of_the_saver_recovers(
    workload: str, full: bool, explorer_seeds: list[int]
) -> None:
    budgets = [(None, explorer_seeds[0])] if full else []
    budgets += [(DEFAULT_STATES, seed) for seed in explorer_seeds]
    for max_states, seed in budgets:
        result = explore(workload, max_states=max_states, seed=seed)
        assert result.ok, f"seed {seed}: {counterexample_text(result.counterexample)}"  # type: ignore[arg-type]


def test_a_keyed_thread_pruned_when_the_power_went_is_not_reported_rolled_back() -> None:
    """Found by the langgraph-keyed workload: ``delete_for_runs`` deleted the thread's
    newest checkpoint while its head record still named it (the head was re-anchored only
    after the deletion), so a power cut in between made ``verify`` report a rollback and
    a new writer refuse the thread. The head is now narrowed durably first, as gc does."""
    result = explore("langgraph-keyed", max_states=10, seed=0)
    assert result.ok, counterexample_text(result.counterexample)  # type: ignore[arg-type]


def test_every_saver_site_is_caught_or_subsumed() -> None:
    assert set(LANGGRAPH_SITES) == set(CAUGHT_BY) | (set(LANGGRAPH_SITES) & set(SUBSUMED_SITES))


@pytest.mark.parametrize(("site", "kind"), sorted(CAUGHT_BY))
def test_each_saver_site_mutant_is_caught(site: str, kind: str, full: bool) -> None:
    result = explore(
        CAUGHT_BY[(site, kind)],
        mutant=f"no-fsync@{site}:{kind}",
        max_states=None if full else DEFAULT_STATES,
        seed=EXPLORER_SEED,
    )
    assert result.removed, "the workload no longer makes this fsync"
    assert not result.ok, f"survived {result.states} states (AFK_EXPLORER_SEED={EXPLORER_SEED})"


_SUBSUMED = sorted(s for s in SUBSUMED_SITES if s in LANGGRAPH_SITES)


@pytest.mark.parametrize(("site", "kind"), _SUBSUMED)
def test_a_subsumed_saver_fsync_survives(site: str, kind: str, full: bool) -> None:
    """Its loss shows in no state; once it does, it belongs with those that must be caught."""
    if not full and (site, kind) != random.Random(EXPLORER_SEED).choice(_SUBSUMED):
        pytest.skip(f"not in today's sample (AFK_EXPLORER_SEED={EXPLORER_SEED}; --torture: all)")
    for workload in ("langgraph", "langgraph-keyed") if full else ("langgraph",):
        result = explore(
            workload,
            mutant=f"no-fsync@{site}:{kind}",
            max_states=None if full else DEFAULT_STATES,
            seed=EXPLORER_SEED,
        )
        assert result.removed
        assert result.ok, counterexample_text(result.counterexample)  # type: ignore[arg-type]
