"""What a store lists (afk_local/storage/listing.py): run infos, filtered, newest created
first."""

from __future__ import annotations

from pathlib import Path

import afk_local as afk
from afk_local.storage import listing
from afk_local.storage.views.run_filter import RunFilter


def test_run_info_says_where_the_run_is(tmp_path: Path) -> None:
    store = afk.Store(tmp_path)
    with store.create("r", extra={"tags": {"team": "a"}}) as run:
        run.checkpoint("runtime_state", {"x": 1}, step=4)
    info = listing.run_info(store, "r")
    assert (info.run_id, info.step, info.seq, info.phase) == ("r", 4, 1, "runtime_state")
    assert info.owner_alive is False
    assert info.bytes > 0
    assert info.tags == {"team": "a"}


def test_runs_are_newest_created_first_filtered_and_limited(tmp_path: Path) -> None:
    store = afk.Store(tmp_path)
    for run_id in ("a", "b", "c"):  # created in that order (a tie: the greater id first)
        with store.create(run_id) as run:
            run.checkpoint("runtime_state", {}, step=1)
    with store.resume_writer("a") as run:  # a later change does not move a run
        run.finish()
    everything = listing.list_runs(store, RunFilter(), None)
    assert [info.run_id for info in everything] == ["c", "b", "a"]
    assert everything[2].status is afk.RunStatus.COMPLETED
    done = listing.list_runs(store, RunFilter(status="completed"), None)
    assert [info.run_id for info in done] == ["a"]
    assert len(listing.list_runs(store, RunFilter(), 2)) == 2


def test_a_run_with_a_damaged_meta_is_left_out(tmp_path: Path) -> None:
    store = afk.Store(tmp_path)
    for run_id in ("good", "bad"):
        store.create(run_id).close()
    store.paths("bad").meta.write_bytes(b"not a meta")
    assert [info.run_id for info in store.runs()] == ["good"]
