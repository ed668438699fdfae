"""The store's meta index (afk_local/storage/meta_index.py): listings and sweeps of many
runs without decoding every ``run.meta``, and never trusting the index over a run."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import msgspec

import afk_local as afk
from afk_local.storage.format import codec
from afk_local.storage.format.codec import RecordCodec
from afk_local.storage.format.records import RunStatus, now_ms
from afk_local.storage.meta_index import INDEX_MIN_RUNS, INDEX_NAME
from afk_local.storage.rundir.creation import new_run_meta

RUNS = INDEX_MIN_RUNS + 100


def _build(root: Path, runs: int = RUNS, base_ms: int = 10_000) -> afk.Store:
    """``runs`` completed runs (meta only: written directly, no fsync), r-00000 oldest,
    updated at ``base_ms`` + ``i``."""
    store = afk.Store(root)
    store.runs_dir.mkdir(parents=True, exist_ok=True)
    record_codec = RecordCodec()
    for i in range(runs):
        run_id = f"r-{i:05d}"
        meta = new_run_meta(run_id, entrypoint="jobs:job")
        meta = msgspec.structs.replace(
            meta, status=RunStatus.COMPLETED, created_ms=base_ms + i, updated_ms=base_ms + i
        )
        os.mkdir(store.runs_dir / run_id, 0o700)
        (store.runs_dir / run_id / "run.meta").write_bytes(codec.encode_meta(record_codec, meta))
    return store


def _full_order(store: afk.Store) -> list[str]:
    return [info.run_id for info in store.runs()]


def test_limited_listings_and_iter_runs_agree_with_the_full_listing(tmp_path: Path) -> None:
    with afk.Store(tmp_path).create("live") as run:
        # Its meta older than every other run, its checkpoint newer: listed by the latter.
        store = _build(tmp_path, base_ms=run.meta.updated_ms + 1)
        while now_ms() <= run.meta.updated_ms + RUNS + 1:
            time.sleep(0.01)
        run.checkpoint("runtime_state", {"n": 1}, step=1)
        order = _full_order(store)
        assert order[0] == "live"
        assert [i.run_id for i in afk.Store(tmp_path).runs(limit=7)] == order[:7]
    assert (tmp_path / INDEX_NAME).is_file()  # a store this big keeps its index
    fresh = afk.Store(tmp_path)
    assert [i.run_id for i in fresh.iter_runs()] == order
    assert [i.run_id for i in fresh.runs("completed", limit=3)] == order[1:4]


def test_iter_runs_yields_the_newest_run_before_reading_the_others(
    tmp_path: Path, count_loads
) -> None:
    store = _build(tmp_path)
    afk.Store(tmp_path).runs(limit=1)  # the index on disk
    read: list[str] = []
    fresh = afk.Store(tmp_path)
    original = fresh.read_meta

    def counting(run_id: str) -> afk.RunMeta:
        read.append(run_id)
        return original(run_id)

    fresh.read_meta = counting  # type: ignore[method-assign]
    first = next(fresh.iter_runs())
    assert first.run_id == f"r-{RUNS - 1:05d}"
    assert len(read) <= 2  # not one per run
    assert store.read_meta(first.run_id).status is RunStatus.COMPLETED


def test_the_index_never_hides_a_change_a_deletion_or_its_own_damage(tmp_path: Path) -> None:
    store = _build(tmp_path)
    assert afk.Store(tmp_path).interrupted() == []  # the index on disk, every run completed
    index = tmp_path / INDEX_NAME
    # A completed run set running again by a writer that then went away: interrupted.
    with afk.Store(tmp_path).resume_writer("r-00003") as run:
        run.update_meta(status=RunStatus.RUNNING)
    shutil.rmtree(store.runs_dir / "r-00004")  # a run deleted behind the index's back
    assert afk.Store(tmp_path).interrupted() == ["r-00003"]
    order = _full_order(afk.Store(tmp_path))
    assert "r-00004" not in order and order[0] == "r-00003"
    for damage in (b"garbage", index.read_bytes()[:100], b""):
        index.write_bytes(damage)
        fresh = afk.Store(tmp_path)
        assert fresh.interrupted() == ["r-00003"]
        assert [i.run_id for i in fresh.runs(limit=len(order))] == order
        assert msgspec.msgpack.decode(index.read_bytes())  # rebuilt and written again


def test_a_small_store_writes_no_index(tmp_path: Path) -> None:
    store = afk.Store(tmp_path)
    store.create("a").close()
    assert [i.run_id for i in store.runs(limit=5)] == ["a"]
    assert store.interrupted() == ["a"]  # created, no owner
    assert not (tmp_path / INDEX_NAME).exists()
