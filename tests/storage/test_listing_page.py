"""One page of a store's listing (afk_local/storage/listing.py, ``page_runs``): the web
page's runs table on stores too large to list whole; and what a liveness filter reads."""

from __future__ import annotations

import os
import time
from pathlib import Path

import afk_local as afk
from afk_local.storage.format.records import RunMeta
from afk_local.storage.listing import list_runs, page_runs
from afk_local.storage.views.run_filter import RunFilter


def _store(root: Path, n: int) -> afk.Store:
    """``n`` runs, r0 the oldest; r0, r3, r6... never finished (interrupted)."""
    store = afk.Store(root)
    an_hour_ago = time.time() - 3600
    for i in range(n):
        with store.create(f"r{i}", extra={"tags": {"parity": ("even", "odd")[i % 2]}}) as run:
            run.checkpoint("runtime_state", {"i": i}, step=i)
            if i % 3:
                run.finish(i)
        # File times are as coarse as the kernel's clock tick: set them, one second apart.
        stamp = an_hour_ago + i
        os.utime(store.paths(f"r{i}").meta, (stamp, stamp))
    return store


def test_pages_hold_every_admitted_run_once_newest_first(tmp_path: Path) -> None:
    store = _store(tmp_path / "store", 7)
    seen: list[str] = []
    offset, more = 0, True
    while more:
        page, matched, more = page_runs(store, RunFilter(), offset, 3)
        assert matched == 7 and len(page) <= 3
        seen += [info.run_id for info in page]
        offset += 3
    assert seen == [f"r{i}" for i in reversed(range(7))]  # created in order: newest first


def test_a_page_applies_the_filter_on_meta_and_on_liveness(tmp_path: Path) -> None:
    store = _store(tmp_path / "store", 7)
    page, matched, more = page_runs(store, RunFilter(tags={"parity": "even"}), 0, 10)
    assert [i.run_id for i in page] == ["r6", "r4", "r2", "r0"] and matched == 4 and not more
    # status "interrupted" is decided from each run's lock: r0, r3, r6 never finished
    page, matched, _ = page_runs(store, RunFilter(status="interrupted"), 0, 10)
    assert [i.run_id for i in page] == ["r6", "r3", "r0"] and matched == 3
    page, matched, more = page_runs(store, RunFilter(status="interrupted"), 1, 1)
    assert [i.run_id for i in page] == ["r3"] and more
    assert matched == 3  # counted from the locks: nothing of r0 is read
    page, matched, more = page_runs(store, RunFilter(status="interrupted", name="r[36]"), 0, 1)
    assert [i.run_id for i in page] == ["r6"] and more
    assert matched is None  # counting would read the rest of the metas
    page, _, more = page_runs(store, RunFilter(tags={"parity": "odd"}), 2, 2)
    assert [i.run_id for i in page] == ["r1"] and not more


def test_the_newest_change_of_run_meta_comes_first(tmp_path: Path) -> None:
    store = _store(tmp_path / "store", 3)
    afk.cancel("r0", store=store)  # rewrites r0's run.meta now: it changed last
    page, _, _ = page_runs(store, RunFilter(), 0, 10)
    assert [i.run_id for i in page] == ["r0", "r2", "r1"]
    page, _, _ = page_runs(store, RunFilter(status="cancelled"), 0, 10)
    assert [i.run_id for i in page] == ["r0"]


class _Counted:
    """``store`` counting the runs whose info (meta and checkpoints) a listing reads."""

    def __init__(self, store: afk.Store) -> None:
        self._store = store
        self.read: list[str] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    def info(self, run_id: str) -> afk.RunInfo:
        self.read.append(run_id)
        return self._store.info(run_id)

    def read_meta(self, run_id: str) -> RunMeta:
        self.read.append(run_id)
        return self._store.read_meta(run_id)


def test_a_liveness_filter_reads_only_the_runs_it_shows(tmp_path: Path) -> None:
    store = _store(tmp_path / "store", 12)
    with store.create("owned") as run:  # this process holds its lock: live
        run.checkpoint("runtime_state", {"i": 0}, step=0)
        counted = _Counted(store)
        page, matched, more = page_runs(counted, RunFilter(status="live"), 0, 10)
        assert [i.run_id for i in page] == ["owned"] and matched == 1 and not more
        assert counted.read == ["owned"]  # the 12 others: a lock probe each, nothing read
        counted = _Counted(store)
        page, matched, more = page_runs(counted, RunFilter(status="interrupted"), 0, 2)
        assert [i.run_id for i in page] == ["r9", "r6"] and matched == 4 and more
        assert counted.read == ["r9", "r6"]
        counted = _Counted(store)  # `afk-local runs --status live` alike
        assert [i.run_id for i in list_runs(counted, RunFilter(status="live"), None)] == ["owned"]
        assert counted.read == ["owned", "owned"]  # its meta, then its info
    page, matched, _ = page_runs(store, RunFilter(status="live"), 0, 10)
    assert page == [] and matched == 0  # its owner is gone: no longer live
