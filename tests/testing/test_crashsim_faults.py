"""The explorer's workloads on a faulty disk and of fencing (crashsim.suites.faults).

- Every crash state of each recovers: a fork where hard links are refused, a journal made
  by its first open, a journal with a torn tail, a journal fsync that fails once, a run
  fenced on this machine. Default suite: a small draw with today's explorer seed
  (``AFK_EXPLORER_SEED``); ``--torture``: every state, then many seeds.
- Each of their site mutants (``FAULT_SITES``) is caught by the workload that makes its
  fsync (default: a budget drawn with today's seed; ``--torture``: every state), except
  the subsumed ones (``SUBSUMED_SITES``), which survive every state, as they say.
- The model of a failed fsync: a crash may keep what it covered, until an fsync succeeds.
"""

from __future__ import annotations

import pytest
from conftest import EXPLORER_SEED

from afk_local.testing.crashsim import explore
from afk_local.testing.crashsim.disk import FILE, Node
from afk_local.testing.crashsim.model import DiskModel
from afk_local.testing.crashsim.mutants import FAULT_SITES, SUBSUMED_SITES
from afk_local.testing.crashsim.report import counterexample_text
from afk_local.testing.crashsim.suites.faults import FAULT_WORKLOADS
from afk_local.testing.crashsim.trace import Op

DEFAULT_STATES = 30
"""Default suite: crash states per fault workload (--torture: every one)."""

MADE_BY = {
    "fork._link_or_copy": "fork-links-refused",
    "reading._open": "journal-opened",
    "reading._load": "journal-torn-tail",
    "appending._discard_unsynced_locked": "journal-eio",
    "mirror.mark_fenced": "fenced",
}
"""The fault workload that makes each fault site's fsync."""


@pytest.mark.parametrize("workload", [w.name for w in FAULT_WORKLOADS])
def test_every_crash_state_of_every_fault_workload_recovers(
    workload: str, full: bool, explorer_seeds: list[int]
) -> None:
    budgets = [(None, explorer_seeds[0])] if full else []
    budgets += [(DEFAULT_STATES, seed) for seed in explorer_seeds]
    for max_states, seed in budgets:
        result = explore(workload, max_states=max_states, seed=seed)
        assert result.ok, f"seed {seed}: {counterexample_text(result.counterexample)}"  # type: ignore[arg-type]


def test_every_fault_site_names_the_workload_that_makes_it() -> None:
    assert {site for site, _ in FAULT_SITES} == set(MADE_BY)


@pytest.mark.parametrize(("site", "kind"), [s for s in FAULT_SITES if s not in SUBSUMED_SITES])
def test_each_fault_site_mutant_is_caught_by_its_workload(site: str, kind: str, full: bool) -> None:
    result = explore(
        MADE_BY[site],
        mutant=f"no-fsync@{site}:{kind}",
        max_states=None if full else DEFAULT_STATES,
        seed=EXPLORER_SEED,
    )
    assert result.removed, "the workload no longer makes this fsync"
    assert not result.ok, f"survived {result.states} states (AFK_EXPLORER_SEED={EXPLORER_SEED})"
    assert result.counterexample is not None and result.counterexample.problems


@pytest.mark.parametrize(("site", "kind"), sorted(set(SUBSUMED_SITES) & set(FAULT_SITES)))
def test_a_subsumed_fsync_survives_every_crash_state(site: str, kind: str) -> None:
    """Its loss shows in no state; once it does, it belongs with those that must be caught."""
    result = explore(MADE_BY[site], mutant=f"no-fsync@{site}:{kind}", max_states=None)
    assert result.removed
    assert result.ok, counterexample_text(result.counterexample)  # type: ignore[arg-type]


def _op(index: int, operation: str, path: str, **fields: object) -> Op:
    return Op(index=index, operation=operation, path=path, **fields)  # type: ignore[arg-type]


def test_a_failed_fsync_may_have_written_what_it_covered_until_one_succeeds() -> None:
    model = DiskModel({"log": Node(FILE, data=b"old", inode=1)})
    model.apply(_op(1, "write", "log", data=b"new record", offset=3))
    assert set(model.frontier(1).contents[2]) == {b"old", b"oldnew record"}
    model.apply(_op(2, "fsync-failed", "log"))
    model.apply(_op(3, "truncate", "log", offset=3))  # the writer cuts back to "old"
    assert set(model.frontier(3).contents[2]) == {b"old", b"oldnew record"}
    model.apply(_op(4, "fsync", "log", site="t.cut"))
    assert model.frontier(4).contents[2] == (b"old",)


def test_a_fsync_that_never_failed_leaves_nothing_it_did_not_cover() -> None:
    model = DiskModel({"log": Node(FILE, data=b"old", inode=1)})
    model.apply(_op(1, "write", "log", data=b"new record", offset=3))
    model.apply(_op(2, "truncate", "log", offset=3))
    assert model.frontier(2).contents[2] == (b"old",)
