"""``runs.changes`` (afk_local/storage/rundir/run_changes.py): the writers that create,
change and delete runs tell the store's listings, so the first listing after a bulk of
creations reads no run's meta to order them; concurrent writers lose no record; garbled,
planted or lying records are refused or outvoted by the runs themselves, never trusted
for a decision."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from proc import spawn

import afk_local as afk
from afk_local.storage import meta_index
from afk_local.storage.format import codec, meta_index_file
from afk_local.storage.format.frames import FRAME_HEADER, encode_frame
from afk_local.storage.format.integrity import MAC_SIZE
from afk_local.storage.format.meta_index_file import (
    MAX_CHANGE_BYTES,
    MetaSummary,
    decode_changes,
    encode_change,
)
from afk_local.storage.format.records import RunStatus
from afk_local.storage.meta_index import INDEX_NAME, MetaIndex
from afk_local.storage.rundir.run_changes import CHANGES_NAME

RUNS = 12


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The run ids whose ``run.meta`` a meta index decodes (a spy, nothing replaced)."""
    seen: list[str] = []
    real = MetaIndex._read

    def spy(self: MetaIndex, name: str, st: os.stat_result, dir_ino: int) -> object:
        seen.append(name)
        return real(self, name, st, dir_ino)

    monkeypatch.setattr(MetaIndex, "_read", spy)
    yield seen


def _create(store: afk.Store, n: int = RUNS) -> list[str]:
    ids = []
    for i in range(n):
        with store.create(f"r-{i:03d}", entrypoint="jobs:job") as run:
            if i % 3 == 0:
                run.finish(i)
        ids.append(f"r-{i:03d}")
    return ids


def _truth(root: Path) -> list[str]:
    """Every run, newest created first, from the metas themselves."""
    store = afk.Store(root)
    metas = [store.read_meta(r) for r in store.run_ids()]
    metas.sort(key=lambda m: (m.created_ms, m.run_id), reverse=True)
    return [m.run_id for m in metas]


def test_the_first_listing_after_creations_reads_no_meta_to_order_them(
    tmp_path: Path, reads: list[str]
) -> None:
    store = afk.Store(tmp_path)
    _create(store)
    assert (tmp_path / CHANGES_NAME).stat().st_size > 0
    assert not (tmp_path / INDEX_NAME).exists()
    listed = [info.run_id for info in afk.Store(tmp_path).runs(limit=5)]
    assert listed == _truth(tmp_path)[:5]
    assert reads == []  # the order came from runs.changes: no run.meta decoded for it


def test_finishes_and_deletions_are_told_so_a_sweep_decodes_nothing(
    tmp_path: Path, reads: list[str]
) -> None:
    store = afk.Store(tmp_path)
    ids = _create(store)
    with store.resume_writer(ids[1]) as run:  # a status change after creation
        run.fail(RuntimeError("boom"))
    store.delete(ids[2])
    fresh = afk.Store(tmp_path).meta_index()
    summaries = fresh.summaries()  # stats every run, decodes the ones not told
    assert reads == []
    assert ids[2] not in summaries
    assert summaries[ids[1]].status == "failed"
    assert summaries[ids[0]].status == "completed"
    assert summaries[ids[4]].status == "created"  # closed unfinished


def test_a_status_filter_and_the_interrupted_sweep_see_the_runs_own_status(
    tmp_path: Path,
) -> None:
    store = afk.Store(tmp_path)
    ids = _create(store)
    fresh = afk.Store(tmp_path)
    assert [r.run_id for r in fresh.runs(status="completed")] == [
        r for r in _truth(tmp_path) if int(r[2:]) % 3 == 0
    ]
    # every other run was closed unfinished: `created` with a free lock, i.e. interrupted
    assert fresh.interrupted() == sorted(r for r in ids if int(r[2:]) % 3)


CREATOR = """
import sys, time
import afk_local as afk
root, prefix, n, at = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
store = afk.Store(root)
while time.time() < at:
    time.sleep(0.001)
for i in range(n):
    store.create(f"{prefix}-{i:03d}", entrypoint="jobs:job").close()
print("done", flush=True)
"""


def test_writers_creating_runs_at_the_same_instant_lose_no_record(tmp_path: Path) -> None:
    afk.Store(tmp_path).create("first").close()  # the store's identity, made once
    writers, each = 4, 10
    at = time.time() + 1.0  # every child starts creating at this instant (once started)
    children = [spawn(CREATOR, str(tmp_path), f"w{k}", str(each), str(at)) for k in range(writers)]
    for child in children:
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0 and "done" in out, err
    data = (tmp_path / CHANGES_NAME).read_bytes()
    records, end, problem = decode_changes(data, 0, None)
    assert (end, problem) == (len(data), None)  # every frame whole: no interleaving
    told = {r.run_id for r in records if r.summary is not None}
    assert told == {"first"} | {f"w{k}-{i:03d}" for k in range(writers) for i in range(each)}


def _summary_of(root: Path, run_id: str, status: str) -> MetaSummary:
    """A record of ``run_id`` with its meta's real stat but ``status``."""
    st = os.stat(root / "runs" / run_id / "run.meta")
    dir_ino = os.stat(root / "runs" / run_id).st_ino
    return MetaSummary(st.st_ino, st.st_mtime_ns, st.st_size, status, 1, True, 0, 1, dir_ino)


def test_garbled_and_hostile_records_are_refused_and_the_runs_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = afk.Store(tmp_path)
    ids = _create(store, 4)
    changes = tmp_path / CHANGES_NAME
    with open(changes, "ab") as fh:
        fh.write(b"\x05\x00\x00\x00garbage-not-a-frame")  # damage in the middle
    _create_more = afk.Store(tmp_path)
    with _create_more.create("late", entrypoint="jobs:job") as run:
        run.finish(1)
    # after the damage: a valid frame naming a path, and one far over the bound
    with open(changes, "ab") as fh:
        fh.write(encode_frame(msgspec.msgpack.encode(["../escape", None])))
        fh.write(b"\xff\xff\x0f\x00" + b"\x00" * 8)
    fresh = afk.Store(tmp_path)
    caplog.set_level("INFO", logger="afk_local")
    assert [r.run_id for r in fresh.runs()] == _truth(tmp_path)
    assert "runs.changes: read up to byte" in caplog.text
    assert not (tmp_path / "escape").exists()
    assert fresh.meta_index().summaries()["late"].status == "completed"
    # the next listing that saves the index starts the damaged file afresh
    meta_index_obj = fresh.meta_index()
    meta_index_obj._save()
    assert changes.stat().st_size == 0
    assert [r.run_id for r in afk.Store(tmp_path).runs()] == _truth(tmp_path)
    assert set(ids) <= set(_truth(tmp_path))


def test_a_record_that_lies_about_a_changed_meta_is_outvoted_by_the_run(tmp_path: Path) -> None:
    store = afk.Store(tmp_path)
    _create(store, 3)
    lie = _summary_of(tmp_path, "r-001", "completed")  # r-001 is `created`
    lie = msgspec.structs.replace(lie, ino=lie.ino + 1)  # ...and its stat is not the meta's
    with open(tmp_path / CHANGES_NAME, "ab") as fh:
        fh.write(encode_change("r-001", lie, None))
    fresh = afk.Store(tmp_path)
    assert fresh.meta_index().summaries()["r-001"].status == "created"
    assert "r-001" in fresh.interrupted()


def test_a_keyed_store_refuses_a_record_planted_without_the_key(tmp_path: Path) -> None:
    store = afk.Store(tmp_path, key="k1")
    _create(store, 3)
    # with the meta's true stat, claiming the interrupted run completed: no MAC
    with open(tmp_path / CHANGES_NAME, "ab") as fh:
        fh.write(encode_change("r-001", _summary_of(tmp_path, "r-001", "completed"), None))
    fresh = afk.Store(tmp_path, key="k1")
    assert "r-001" in fresh.interrupted()
    assert fresh.meta_index().summaries()["r-001"].status == "created"


def test_a_store_an_older_version_wrote_lists_from_its_metas(
    tmp_path: Path, reads: list[str]
) -> None:
    store = afk.Store(tmp_path)
    _create(store, 4)
    (tmp_path / CHANGES_NAME).unlink()
    assert [r.run_id for r in afk.Store(tmp_path).runs()] == _truth(tmp_path)
    assert sorted(reads) == sorted(_truth(tmp_path))


def test_a_told_change_reaches_a_steady_sweep_and_an_untold_one_its_slice(
    tmp_path: Path,
) -> None:
    store = afk.Store(tmp_path)
    ids = _create(store, 6)
    index = afk.Store(tmp_path).meta_index()
    assert {ids[1], ids[2]} <= set(index.steady_summaries(10**6))  # `created`: awake
    with store.resume_writer(ids[1]) as run:
        run.finish(1)
    assert ids[1] not in index.steady_summaries(10**6)  # told: no slice needed
    # an older writer's change, with no record: found within `slices` steady sweeps
    paths = store.paths(ids[2])
    meta = msgspec.structs.replace(store.read_meta(ids[2]), status=RunStatus.CANCELLED)
    os.replace(_written(paths.dir / "new.meta", codec.encode_meta(store.codec, meta)), paths.meta)
    assert any(ids[2] not in index.steady_summaries(3) for _ in range(3))


def _written(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_the_index_file_records_how_much_of_runs_changes_it_holds(tmp_path: Path) -> None:
    store = afk.Store(tmp_path)
    _create(store, 3)
    index = afk.Store(tmp_path).meta_index()
    index.summaries()
    index._save()
    held = meta_index_file_changes(tmp_path)
    assert held is not None and held[1] == (tmp_path / CHANGES_NAME).stat().st_size


def meta_index_file_changes(root: Path) -> tuple[int, int] | None:
    from afk_local.storage.format.meta_index_file import decode_index  # noqa: PLC0415

    return decode_index((root / meta_index.INDEX_NAME).read_bytes()).changes


@settings(max_examples=300, deadline=None)
@given(
    frames=st.lists(
        st.tuples(
            st.binary(min_size=0, max_size=40),
            st.sampled_from(["plain", "signed", "bad crc", "huge", "cut"]),
        ),
        max_size=8,
    ),
    count=st.integers(min_value=-1, max_value=9),
)
def test_the_fast_frame_reader_reads_what_the_general_one_does(
    frames: list[tuple[bytes, str]], count: int
) -> None:
    """The reader of a store without a key (one crc per unsigned frame, and the general
    loop from a signed one on) stops where, and for the reason, the general loop does."""
    data = b""
    for body, kind in frames:
        if kind == "signed":
            frame = encode_frame(body or b"x", b"m" * MAC_SIZE)
        elif kind == "huge":
            frame = FRAME_HEADER.pack(MAX_CHANGE_BYTES + 1, 0) + body
        else:
            frame = encode_frame(body or b"x")
            if kind == "bad crc":
                frame = frame[:4] + bytes([frame[4] ^ 1]) + frame[5:]
            elif kind == "cut":
                frame = frame[:-1]
        data += frame
    fast = meta_index_file._frames(data, 0, None, count)
    general = meta_index_file._checked_frames(data, 0, None, count)
    assert [bytes(b) for b in fast[0]] == [bytes(b) for b in general[0]]
    assert fast[1:] == general[1:]
