"""Issue 29, "what a run costs": the crash explorer's run-creation workload.

A new run is built under a temporary name and published with one rename, a durable
function's together with its first checkpoint; the workload records ``Store.create``
and a one-step sync job. Every crash state recovers, also after crashing a second time
while a new process redoes the work, and every fsync a new run makes has a site mutant
that this workload catches (docs/guarantees.md, "What a new run costs").
"""

from __future__ import annotations

import pytest

from afk_local.testing.crashsim import explore
from afk_local.testing.crashsim.explorer import DEFAULT_MAX_STATES
from afk_local.testing.crashsim.hunt import fsync_sites
from afk_local.testing.crashsim.mutants import RUN_SITES
from afk_local.testing.crashsim.report import counterexample_text


def test_every_crash_state_of_run_creation_recovers_after_crashing_twice(full: bool) -> None:
    result = explore(
        "create",
        max_states=None if full else DEFAULT_MAX_STATES,
        depth=2,
        second_crashes=None if full else 4,
        seed=1,
    )
    assert result.counterexample is None, counterexample_text(result.counterexample)
    assert result.first_states_rerun >= 1


def test_every_fsync_of_a_new_run_has_a_site_mutant() -> None:
    """A new fsync on a run's path must get a mutant; a mutant must still name an fsync."""
    made = set(fsync_sites("create"))
    once_per_store = ("store_identity.", "creation.begin_run_dir")  # identity, runs/ itself
    store_setup = {s for s in made if s[0].startswith(once_per_store)}
    assert made - store_setup == set(RUN_SITES)


@pytest.mark.parametrize("site", [f"{site}:{kind}" for site, kind in RUN_SITES])
def test_the_creation_workload_catches_each_run_site_mutant(site: str, full: bool) -> None:
    result = explore(
        "create", mutant=f"no-fsync@{site}", max_states=None if full else DEFAULT_MAX_STATES
    )
    found = result.counterexample
    assert found is not None, f"no-fsync@{site} was not caught"
    assert found.ignored and found.problems


def test_the_creation_workload_catches_a_torn_completed_meta_when_nothing_stands_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The completed run.meta has no fsync (its copy rides in the terminal checkpoint):
    the explorer reaches the state where a power cut tore it, and without the copy that
    state loses the run."""
    import afk_local.storage.rundir.read.loading as loading  # noqa: PLC0415

    monkeypatch.setattr(loading, "_terminal_copy", lambda paths, record_codec: None)
    result = explore("create", max_states=None, seed=1)
    found = result.counterexample
    assert found is not None, "a torn run.meta was never reached"
    assert any("run.meta" in problem for problem in found.problems), found.problems
