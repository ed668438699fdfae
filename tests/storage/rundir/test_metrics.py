"""Metrics in checkpoint payloads, their archive through gc and forks, and the listing filter."""

from __future__ import annotations

import msgspec
import pytest
import report_jobs

import afk_local as afk
from afk_local.storage.ops.retention import RetentionPolicy
from afk_local.storage.rundir.read import metrics as metrics_module
from afk_local.storage.rundir.read.metrics import ARCHIVE_NAME, add_batch, merge_batches
from afk_local.storage.views.run_filter import parse_since, parse_tag


@pytest.mark.parametrize("entries", [0, 1, 14, 15, 16, 70_000])
def test_add_batch_appends_one_map_entry(entries: int) -> None:
    payload = {f"k{i}": i for i in range(entries)}
    batch = {"loss": [[1, 0.5]]}
    raw = add_batch(msgspec.msgpack.encode(payload), batch)
    assert msgspec.msgpack.decode(raw) == {**payload, "metrics": batch}
    with pytest.raises(ValueError):
        add_batch(msgspec.msgpack.encode([1, 2]), batch)


def test_merge_batches_keeps_order() -> None:
    assert merge_batches(None, {"a": [[1, 1.0]]}) == {"a": [[1, 1.0]]}
    merged = merge_batches({"a": [[1, 1.0]]}, {"a": [[2, 2.0]], "b": [[2, 3.0]]})
    assert merged == {"a": [[1, 1.0], [2, 2.0]], "b": [[2, 3.0]]}


def test_keyed_archive_is_signed_and_a_forged_one_is_ignored(tmp_path) -> None:
    store = afk.Store(tmp_path / "s", key="k1")
    report_jobs.metered.with_store(store).run(8, run_id="r")
    points = store.open("r").metrics().to_records()
    store.gc(RetentionPolicy(keep_runtime_states=1))
    archive = store.paths("r").dir / ARCHIVE_NAME
    assert archive.is_file() and store.open("r").metrics().to_records() == points
    assert store.open("r").verify().ok
    # an archive written with another key (or copied from another run) is not believed
    other = afk.Store(tmp_path / "s", key="k2")
    forged = {1: metrics_module.Stamped(0, {"fake": [[1, 9.0]]})}
    metrics_module.write_archive(other.codec, store.paths("r"), forged)
    assert "fake" not in store.open("r").metrics().names()


def test_a_fork_keeps_the_archived_metrics_up_to_its_seq(afk_store: afk.Store) -> None:
    report_jobs.FAIL_AT[:] = [0]  # the first attempt fails before its first metric
    with pytest.raises(ValueError, match="item 0 broke"):
        report_jobs.metered.with_store(afk_store).run(8, run_id="src")
    report_jobs.metered.with_store(afk_store).run(8, run_id="src")  # the retry: run_started
    afk_store.gc(RetentionPolicy(keep_runtime_states=1))
    kept = [c for c in afk_store.open("src").history() if c.phase == "runtime_state"]
    at = kept[-1].seq  # the only runtime_state left: everything before it is archived
    afk_store.fork("src", at, "copy")
    items = [p.value for p in afk_store.open("copy").metrics().series("item")]
    assert items == [float(i) for i in range(8)]
    run_started = next(c.seq for c in afk_store.open("src").history() if c.phase == "run_started")
    afk_store.fork("src", run_started, "early")
    assert afk_store.open("early").metrics() == []


def test_since_and_tag_parsing() -> None:
    now = 10_000_000_000
    assert parse_since("2h", now) == now - 7_200_000
    assert parse_since("1d12h", now) == now - 129_600_000
    assert parse_since(" 30 m ", now) == now - 1_800_000
    assert parse_since("2026-01-01T00:00:00+00:00", now) == 1_767_225_600_000
    with pytest.raises(ValueError, match="30m, 2h"):
        parse_since("soon", now)
    assert parse_tag("model=small") == ("model", "small")
    assert parse_tag("a=b=c") == ("a", "b=c")
    assert parse_tag("model") == ("model", None)
