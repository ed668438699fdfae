"""Issue 38: what afk_local writes outside a store's runs is inside the crash explorer.

- The workloads of a new store root, an export file, the watcher's service file and
  directories, a push and two pulls recover in every crash state checked.
- A pull that replaces an older local copy leaves the old copy or the new one, never the
  run missing: it swapped the two directories with two renames, and a kill or a power
  cut between them left no run (the explorer's ``pull-replace``, and a real SIGKILL at
  each of the pull's renames, in the slow tier). It now swaps them in one atomic exchange.
- The store's id, made by a process killed between its link and its directory fsync, was
  used by the next push as it was: a power cut after that push could lose it, and the
  store would get a second id while the remote names the first as the run's holder
  (``push-killed-id``). Every ``store_id`` now fsyncs the directory before it returns.
- A pull that takes the run's lease (``pull --take``) into a store that never touched a
  remote: after a power cut the run it reported taken is whole, its effects' outcomes
  are there, and the store keeps the id the bucket now names as the holder
  (``pull-take``).
- Each site mutant of these fsyncs (``OUTSIDE_SITES``, ``REMOTE_SITES``) is caught: the
  default suite hunts a sample drawn with today's explorer seed, ``--torture`` all.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
from conftest import EXPLORER_SEED
from support.proc import run

import afk_local as afk
from afk_local.testing.crashsim import explore
from afk_local.testing.crashsim.hunt import hunt_mutant
from afk_local.testing.crashsim.mutants import OUTSIDE_SITES, REMOTE_SITES
from afk_local.testing.crashsim.registry import WORKLOADS as WORKLOADS_BY_NAME
from afk_local.testing.crashsim.report import counterexample_text, hunt_line
from afk_local.testing.crashsim.suites.outside import afk_local_cli, remote_available
from afk_local.testing.crashsim.workloads import write_run

needs_remote = pytest.mark.skipif(
    not remote_available(), reason="the remote extra (obstore) is not installed"
)

WORKLOADS = ("watcher-service", "push", "pull-new-root", "pull-take")

STATES = 10
"""Default suite: crash states checked per workload (drawn with today's explorer seed);
each resume of a pull runs the pull again, about 0.1 s. ``--torture`` checks every state,
once (a seed only draws among more than ``FULL_CAP`` states of one call): ``pull-replace``
has 2054, about 4 minutes on two shared cores."""

DAILY_SAMPLE = 1
"""Default suite: site mutants hunted per run, drawn from today's explorer seed (each
costs 0.1-3 s: the workloads that make its fsync explored with and without it)."""

HUNT_STATES = 10
"""Default suite: crash states per workload while hunting a mutant (each of these is
caught within 7)."""


@pytest.mark.parametrize("workload", WORKLOADS)
def test_every_crash_state_of_the_outside_workloads_recovers(
    workload: str, full: bool, explorer_seeds: list[int]
) -> None:
    if workload != "watcher-service" and not remote_available():
        pytest.skip("the remote extra (obstore) is not installed")
    for seed in explorer_seeds[:1] if full else explorer_seeds:
        result = explore(workload, max_states=None if full else STATES, seed=seed)
        assert result.counterexample is None, counterexample_text(result.counterexample)
        assert result.states >= 1


@needs_remote
def test_a_store_id_whose_maker_was_killed_before_its_fsync_is_durable_before_a_push_uses_it(
    full: bool,
) -> None:
    result = explore("push-killed-id", max_states=None if full else STATES)
    assert result.counterexample is None, counterexample_text(result.counterexample)


@needs_remote
def test_a_pull_over_an_older_copy_never_leaves_the_run_missing_after_a_power_cut(
    full: bool, explorer_seeds: list[int]
) -> None:
    """Two renames (old copy aside, new one in) left the run missing in between: the
    explorer found it at the first crash state past the first rename."""
    for seed in explorer_seeds[:1] if full else explorer_seeds:
        result = explore("pull-replace", max_states=None if full else STATES, seed=seed)
        assert result.counterexample is None, counterexample_text(result.counterexample)


_PULL_CHILD = """
import sys
import afk_local as afk
from afk_local.integrations.remote import pull_run
from afk_local.testing.kills import kill_at_io_call

switch = kill_at_io_call(int(sys.argv[3]) or None, "rename")
pull_run(afk.Store(sys.argv[1]), sys.argv[2], "far")
print(switch.calls, flush=True)
"""


def _pull_in_child(root: Path, url: str, kill_at: int | None) -> str:
    done = run(_PULL_CHILD, str(root), url, str(kill_at or 0))
    if kill_at is None:
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode == -9, (kill_at, done.returncode, done.stderr)
    return done.stdout


@needs_remote
@pytest.mark.slow
def test_a_pull_killed_at_any_of_its_renames_leaves_the_old_copy_or_the_new_one(
    tmp_path: Path, kill_points
) -> None:
    url = (tmp_path / "bucket").as_uri()
    source = afk.Store(tmp_path / "source")
    write_run(source, "far", 3)
    afk_local_cli("--root", str(source.root), "push", "far", "--to", url)
    template = tmp_path / "template"
    afk_local_cli("--root", str(template), "pull", "far", "--from", url)
    with source.resume_writer("far") as writer:
        writer.checkpoint("runtime_state", {"i": 3}, step=3)
        writer.checkpoint("runtime_state", {"i": 4}, step=4)
    afk_local_cli("--root", str(source.root), "push", "far", "--to", url)

    counting = tmp_path / "counting"
    shutil.copytree(template, counting, symlinks=True)
    renames = int(_pull_in_child(counting, url, None).split()[-1])
    assert renames >= 3  # run.meta and latest in the new copy, the swap (and the trash)
    for kill_at in kill_points(renames, 3):
        root = tmp_path / f"killed-{kill_at}"
        shutil.copytree(template, root, symlinks=True)
        _pull_in_child(root, url, kill_at)
        store = afk.Store(root)
        assert store.exists("far"), f"killed at rename {kill_at}: the run is missing"
        reader = store.open("far")
        assert reader.verify().ok, (kill_at, reader.verify().problems)
        latest = reader.latest()
        assert latest is not None and latest.seq in (3, 5), kill_at
        _pull_in_child(root, url, None)  # pulling again is never blocked by what was left
        latest = afk.Store(root).open("far").latest()
        assert latest is not None and latest.seq == 5


def _site_mutants() -> list[str]:
    return [f"no-fsync@{site}:{kind}" for site, kind in (*OUTSIDE_SITES, *REMOTE_SITES)]


_OURS = (*WORKLOADS, "pull-replace", "push-killed-id")
_SITES: dict[str, dict[tuple[str, str], int]] = {}
_BASELINES: dict[str, bool] = {}


@pytest.mark.parametrize("mutant", _site_mutants())
def test_each_site_mutant_outside_the_runs_is_caught(mutant: str, full: bool) -> None:
    if not full and mutant not in random.Random(EXPLORER_SEED).sample(
        _site_mutants(), DAILY_SAMPLE
    ):
        pytest.skip(f"not in today's sample (AFK_EXPLORER_SEED={EXPLORER_SEED}; --torture: all)")
    site = mutant.removeprefix("no-fsync@").rpartition(":")[0]
    if site.startswith(("identity.", "pull.")) and not remote_available():
        pytest.skip("the remote extra (obstore) is not installed")
    if not _SITES:  # hunted in these workloads only (no other makes these fsyncs)
        _SITES.update({name: {} for name in WORKLOADS_BY_NAME if name not in _OURS})
    found = hunt_mutant(
        mutant, max_states=None if full else HUNT_STATES, sites=_SITES, baselines=_BASELINES
    )
    assert found.caught is not None, hunt_line(found)
    caught = found.caught.counterexample
    assert caught is not None and caught.ignored and caught.problems
