"""Every fsync site has a site mutant, by construction, and the explorer catches each.

- From the source: every function of afk_local that calls an fsyncing method of the I/O
  seam is a site with a mutant, or is listed in ``UNMODELLED_SITES`` with the reason no
  workload makes it (a stated gap). A new fsync fails this test until it gets both.
- From the recordings: every fsync any workload makes has a site mutant, and every site
  mutant names an fsync some workload makes.
- Each site mutant of the operations (``OPERATION_SITES``) is caught by a workload that
  recovers without it: the default suite hunts a sample drawn with today's explorer seed
  (``AFK_EXPLORER_SEED``), ``--torture`` every one with no budget. (The rewrite and
  run-creation mutants are hunted in test_crashsim_rewrites.py and test_crashsim_create.py,
  those of the files outside the runs in test_crashsim_outside.py, those of a faulty
  disk and fencing in test_crashsim_faults.py, the LangGraph saver's in
  test_crashsim_langgraph.py; ``SUBSUMED_SITES`` survive by construction, and are
  checked to, there.)
"""

from __future__ import annotations

import random

import pytest
from conftest import EXPLORER_SEED

from afk_local.testing.crashsim.hunt import (
    fsync_sites,
    hunt_mutant,
    recorded_sites,
    seam_call_sites,
)
from afk_local.testing.crashsim.mutants import (
    LANGGRAPH_SITES,
    OPERATION_SITES,
    REMOTE_SITES,
    SITE_MUTANTS,
    SUBSUMED_SITES,
    UNMODELLED_SITES,
)
from afk_local.testing.crashsim.registry import WORKLOADS
from afk_local.testing.crashsim.report import hunt_line
from afk_local.testing.crashsim.suites.outside import remote_available

HUNT_STATES = 60
"""Default suite: crash states per workload while hunting a mutant."""

DAILY_SAMPLE = 2
"""Default suite: operation site mutants hunted per run (a different few each day)."""


def test_every_fsync_call_site_in_the_source_has_a_site_mutant_or_a_stated_gap() -> None:
    in_source = seam_call_sites()
    with_mutant = {site for site, _ in SITE_MUTANTS.values()}
    missing = sorted(set(in_source) - with_mutant - set(UNMODELLED_SITES))
    assert not missing, [f"{site} ({in_source[site]})" for site in missing]
    stale = sorted(set(UNMODELLED_SITES) - set(in_source))
    assert not stale, f"listed as unmodelled but no longer in the source: {stale}"
    assert not with_mutant & set(UNMODELLED_SITES)
    assert set(SUBSUMED_SITES) <= set(SITE_MUTANTS.values())
    assert with_mutant <= set(in_source), sorted(with_mutant - set(in_source))


def test_every_fsync_the_explorer_records_has_a_site_mutant_and_back() -> None:
    recorded = recorded_sites()
    mutants = set(SITE_MUTANTS.values())
    if not remote_available():  # the pull and push workloads need the remote extra
        mutants -= set(REMOTE_SITES)
    if "langgraph" not in WORKLOADS:  # the saver's workloads need the extra
        mutants -= set(LANGGRAPH_SITES)
    assert set(recorded) <= mutants, sorted(set(recorded) - mutants)
    assert mutants <= set(recorded), sorted(mutants - set(recorded))


def _sample(full: bool) -> list[str]:
    names = [f"no-fsync@{site}:{kind}" for site, kind in OPERATION_SITES]
    if full:
        return names
    return random.Random(EXPLORER_SEED).sample(names, DAILY_SAMPLE)


_SITES: dict[str, dict[tuple[str, str], int]] = {}
_BASELINES: dict[str, bool] = {}


@pytest.mark.parametrize("index", range(len(OPERATION_SITES)))
def test_each_operation_site_mutant_is_caught(index: int, request: pytest.FixtureRequest) -> None:
    full = bool(request.config.getoption("--torture"))
    names = [f"no-fsync@{site}:{kind}" for site, kind in OPERATION_SITES]
    mutant = names[index]
    if mutant not in _sample(full):
        pytest.skip(f"not in today's sample (AFK_EXPLORER_SEED={EXPLORER_SEED}; --torture: all)")
    found = hunt_mutant(
        mutant, max_states=None if full else HUNT_STATES, sites=_SITES, baselines=_BASELINES
    )
    assert found.caught is not None, hunt_line(found)
    caught = found.caught.counterexample
    assert caught is not None and caught.ignored and caught.problems


def test_metrics_gc_rewrites_nothing_so_its_archive_mutant_is_catchable() -> None:
    """``no-fsync@metrics.write_archive:dir`` escaped a default ``--mutant sites`` run: the
    workload's checkpoints were meant to be keyframes (new random state each), yet the
    delta policy chose deltas at times, gc then rewrote one between the archive and the
    deletions, and that rewrite's directory fsync covered the archive's name (recordings
    of 10 to 16 calls). Its store now writes keyframes only."""
    for _ in range(3):
        sites = fsync_sites("metrics-gc")
        assert ("retention.rewrite_as_keyframe", "file") not in sites, sites
        assert sites[("metrics.write_archive", "dir")] == 1
