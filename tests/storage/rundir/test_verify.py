"""verify (afk_local/storage/rundir/verify.py): a ``latest`` pointing below the newest
checkpoint."""

from __future__ import annotations

from pathlib import Path

import afk_local as afk
from afk_local.storage import fsio


def _run(store: afk.Store, *, finish: bool) -> None:
    with store.create("r") as run:
        for i in range(1, 6):
            run.checkpoint("runtime_state", {"i": i}, step=i)
        if finish:
            run.finish("done")


def _point_latest_at(store: afk.Store, seq: int) -> None:
    (file,) = [f for f in store.open("r").checkpoint_files() if f.seq == seq]
    fsio.atomic_symlink(file.name, store.paths("r").latest)


def test_latest_rolled_back_below_the_newest_checkpoint_is_a_problem(tmp_path: Path) -> None:
    """What a second writer (a forked child's flush) leaves: verify must not call it ok."""
    store = afk.Store(tmp_path)
    _run(store, finish=True)
    _point_latest_at(store, 2)
    report = store.open("r").verify()
    assert not report.ok
    (problem,) = report.problems
    assert problem.path.endswith("latest") and "below" in problem.reason, problem


def test_a_completed_run_whose_latest_is_not_its_end_is_a_problem(tmp_path: Path) -> None:
    store = afk.Store(tmp_path)
    _run(store, finish=True)
    _point_latest_at(store, 5)  # one below: a crash cannot do this once meta says completed
    assert not store.open("r").verify().ok


def test_latest_one_below_in_a_running_run_is_what_a_crash_leaves(tmp_path: Path) -> None:
    """Killed between publishing checkpoint N and swapping latest: a note, not damage."""
    store = afk.Store(tmp_path)
    _run(store, finish=False)
    _point_latest_at(store, 4)
    report = store.open("r").verify()
    assert report.ok, report.problems
    assert any("latest" in note for note in report.notes), report.notes
