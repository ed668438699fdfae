"""The store's meta index (afk_local/storage/meta_index.py, over its parts in
storage/index/): listings of many runs, newest created first, that read only the runs
they show, and never trust the index over a run: a status shown is the run's own, a run
another process created or deleted is seen, and a damaged or planted ``runs.index`` is
rebuilt or ignored, never followed."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pytest
from proc import run, spawn

import afk_local as afk
from afk_local.cli.main import main as cli_main
from afk_local.storage import dir_stamp, meta_index
from afk_local.storage.format import codec, meta_index_file
from afk_local.storage.format.codec import RecordCodec
from afk_local.storage.format.integrity import signer_for
from afk_local.storage.format.records import RunStatus
from afk_local.storage.index import index_file
from afk_local.storage.meta_index import INDEX_MIN_RUNS, INDEX_NAME
from afk_local.storage.rundir.write.creation import new_run_meta

RUNS = INDEX_MIN_RUNS + 100
SUPPORT = str(Path(__file__).resolve().parents[1] / "support")


def _build(root: Path, runs: int = RUNS, base_ms: int = 10_000) -> afk.Store:
    """``runs`` completed runs (meta only: written directly, no fsync), r-00000 created
    first, at ``base_ms`` + ``i``."""
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


def _truth(root: Path) -> list[tuple[str, str]]:
    """(run id, status) of every readable run, newest created first, from the metas."""
    store = afk.Store(root)
    metas = []
    for run_id in store.run_ids():
        try:
            metas.append(store.read_meta(run_id))
        except afk.AfkLocalError:
            continue
    metas.sort(key=lambda m: (m.created_ms, m.run_id), reverse=True)
    return [(m.run_id, m.status.value) for m in metas]


def _listed(root: Path, limit: int | None = None) -> list[tuple[str, str]]:
    return [(i.run_id, i.status.value) for i in afk.Store(root).runs(limit=limit)]


@pytest.fixture
def settle(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Call it to let ``runs/`` settle, so that its stamp may vouch for its names (the
    default wait, 2 s, covers coarse filesystems; 0.2 s covers this test's)."""
    monkeypatch.setattr(dir_stamp, "SETTLED_NS", 200_000_000)
    return lambda: time.sleep(0.25)


@pytest.fixture
def io_count(monkeypatch: pytest.MonkeyPatch) -> Callable[[], dict[str, int]]:
    """Call it to start counting ``os.stat`` of ``run.meta`` files and ``os.scandir`` of
    ``runs/`` (the listing's per-run I/O); returns the live counts."""

    def start() -> dict[str, int]:
        counts = {"meta stats": 0, "scans": 0}
        stat, scandir = os.stat, os.scandir

        def counting_stat(path, *args, **kwargs):  # type: ignore[no-untyped-def]
            if str(path).endswith("/run.meta"):
                counts["meta stats"] += 1
            return stat(path, *args, **kwargs)

        def counting_scandir(path="."):  # type: ignore[no-untyped-def]
            if str(path).endswith("/runs"):
                counts["scans"] += 1
            return scandir(path)

        monkeypatch.setattr(os, "stat", counting_stat)
        monkeypatch.setattr(os, "scandir", counting_scandir)
        return counts

    return start


def test_listings_are_newest_created_first_and_agree(tmp_path: Path) -> None:
    store = _build(tmp_path)
    with store.create("live") as run:  # created last: listed first, whatever its meta says
        run.checkpoint("runtime_state", {"n": 1}, step=1)
        order = [i.run_id for i in store.runs()]
        assert order[:3] == ["live", f"r-{RUNS - 1:05d}", f"r-{RUNS - 2:05d}"]
        assert order == [run_id for run_id, _ in _truth(tmp_path)]
        assert [i.run_id for i in afk.Store(tmp_path).runs(limit=7)] == order[:7]
    assert (tmp_path / INDEX_NAME).is_file()  # a store this big keeps its index
    fresh = afk.Store(tmp_path)
    assert [i.run_id for i in fresh.iter_runs()] == order
    assert [i.run_id for i in fresh.runs("completed", limit=3)] == order[1:4]
    assert [i.run_id for i in afk.Store(tmp_path).runs("running")] == ["live"]


def test_iter_runs_yields_the_newest_run_before_looking_at_the_others(
    tmp_path: Path, settle: Callable[[], None], io_count: Callable[[], dict[str, int]]
) -> None:
    store = _build(tmp_path)
    settle()
    afk.Store(tmp_path).runs(limit=1)  # the index on disk, with runs/'s settled stamp
    counts = io_count()
    first = next(afk.Store(tmp_path).iter_runs())
    assert first.run_id == f"r-{RUNS - 1:05d}"
    if dir_stamp.keeps_dir_times(os.stat(store.runs_dir).st_dev):
        assert counts == {"meta stats": 0, "scans": 0}  # runs/ unchanged: not even listed
    # A run created since: runs/ is listed once, and only the new run is read.
    store.create("new").close()
    counts = io_count()
    listed = afk.Store(tmp_path).iter_runs()
    assert next(listed).run_id == "new"
    assert counts["scans"] == 1 and counts["meta stats"] <= 2  # not one per run
    assert next(listed).run_id == first.run_id


def test_another_process_changing_creating_and_deleting_runs_is_seen(
    tmp_path: Path, settle: Callable[[], None]
) -> None:
    _build(tmp_path)
    newest = f"r-{RUNS - 1:05d}"
    settle()
    assert _listed(tmp_path, 2)[0] == (newest, "completed")  # the index on disk
    # A status change alone leaves runs/ as it was: the listing still shows the new one.
    script = """
import sys
import afk_local as afk
store = afk.Store(sys.argv[1])
with store.resume_writer(sys.argv[2]) as run:
    run.update_meta(status=afk.RunStatus.RUNNING)
"""
    done = run(script, str(tmp_path), newest)
    assert done.returncode == 0, done.stderr
    assert _listed(tmp_path, 2)[0] == (newest, "running")
    assert [i.run_id for i in afk.Store(tmp_path).runs("running")] == [newest]
    assert newest not in [i.run_id for i in afk.Store(tmp_path).runs("completed")]
    assert afk.Store(tmp_path).interrupted() == [newest]
    settle()
    _listed(tmp_path, 1)
    script = """
import sys
import afk_local as afk
store = afk.Store(sys.argv[1])
with store.create("made-elsewhere") as run:
    run.checkpoint("runtime_state", {"n": 1}, step=1)
    run.finish(1)
store.delete("r-00005")
"""
    done = run(script, str(tmp_path))
    assert done.returncode == 0, done.stderr
    listed = _listed(tmp_path)
    assert listed[:2] == [("made-elsewhere", "completed"), (newest, "running")]
    assert "r-00005" not in {run_id for run_id, _ in listed}
    assert listed == _truth(tmp_path)


def test_a_run_deleted_and_created_again_under_its_id_is_listed_as_new(
    tmp_path: Path, settle: Callable[[], None]
) -> None:
    store = _build(tmp_path)
    settle()
    _listed(tmp_path, 1)  # the index on disk knows r-00003 as created early
    old_inode = os.stat(store.runs_dir / "r-00003").st_ino
    script = """
import sys
import afk_local as afk
store = afk.Store(sys.argv[1])
store.delete("r-00003")
store.create("r-00003").close()  # its directory may get the old one's inode number
"""
    done = run(script, str(tmp_path))
    assert done.returncode == 0, done.stderr
    reused = os.stat(store.runs_dir / "r-00003").st_ino == old_inode
    assert _listed(tmp_path, 2)[0] == ("r-00003", "created"), f"inode reused: {reused}"
    assert _listed(tmp_path) == _truth(tmp_path)
    assert (tmp_path / meta_index.DELETED_NAME).is_file()


def test_a_listing_while_another_process_creates_runs_misses_none(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    settle: Callable[[], None],
    trials: Callable[[int, int], int],
) -> None:
    monkeypatch.setattr(index_file, "INDEX_MIN_RUNS", 10)  # the index on disk from the start
    _build(tmp_path, 20)
    settle()
    afk.Store(tmp_path).runs(limit=1)  # with runs/'s stamp
    script = """
import sys
import afk_local as afk
store = afk.Store(sys.argv[1])
for i in range(int(sys.argv[2])):
    with store.create(f"w-{i:04d}") as run:
        run.checkpoint("runtime_state", {"i": i}, step=1)
        run.finish(i)
    print(f"w-{i:04d}", flush=True)
"""
    rounds = trials(8, 80)
    child = spawn(script, str(tmp_path), str(rounds * 25), env={"PYTHONPATH": SUPPORT})
    finished: list[str] = []
    reader = threading.Thread(target=lambda: finished.extend(_lines(child.stdout)), daemon=True)
    reader.start()
    try:
        while not finished and child.poll() is None:
            time.sleep(0.01)  # the child's first run is done: it writes while we list
        for _ in range(rounds):
            before = list(finished)  # each completed before this listing began
            listed = dict(_listed(tmp_path))
            for run_id in before:
                assert listed.get(run_id) == "completed", run_id
            for run_id in [f"r-{i:05d}" for i in range(20)]:
                assert listed[run_id] == "completed"
        assert finished, child.stderr.read() if child.stderr else ""
    finally:
        child.kill()
        child.wait()


def _lines(stream: object) -> Iterator[str]:
    for line in stream:  # type: ignore[attr-defined]
        yield line.strip()


def _forged(store: afk.Store, ids: list[str], stamp: object) -> bytes:
    """A well-formed ``runs.index`` listing ``ids`` as the whole order, with ``stamp`` (its
    digest right: what someone who can write an unkeyed store can plant)."""
    order = [(len(ids) - i, run_id, 0) for i, run_id in enumerate(ids)]
    return meta_index_file.encode_index(stamp, [], order, {}, None)  # type: ignore[arg-type]


def test_a_damaged_or_planted_index_is_rebuilt_or_ignored_never_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, io_count: Callable[[], dict[str, int]]
) -> None:
    store = _build(tmp_path)
    index = tmp_path / INDEX_NAME
    truth = _truth(tmp_path)
    assert _listed(tmp_path) == truth  # the index on disk
    good = index.read_bytes()
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copy(store.runs_dir / "r-00001" / "run.meta", outside / "run.meta")
    elsewhere = tmp_path / "elsewhere.index"
    elsewhere.write_bytes(good)
    stamp = dir_stamp.dir_stamp(str(store.runs_dir))
    unsorted = _forged(store, ["r-00001", "r-00002"], stamp)
    unsorted_chunk = meta_index_file.Chunk(["r-00001", "r-00002"], [0, 0], [1, 2])
    reversed_order = msgspec.msgpack.decode(unsorted)
    reversed_order["order"] = [msgspec.msgpack.encode(unsorted_chunk)]
    flipped = bytearray(good)
    flipped[len(good) // 2] ^= 0x10
    damages: dict[str, Callable[[], None]] = {
        "garbage": lambda: index.write_bytes(b"garbage"),
        "torn": lambda: index.write_bytes(good[: len(good) // 2]),
        "empty": lambda: index.write_bytes(b""),
        "zeros": lambda: index.write_bytes(bytes(len(good))),
        "not newest first": lambda: index.write_bytes(msgspec.msgpack.encode(reversed_order)),
        "a flipped bit": lambda: index.write_bytes(bytes(flipped)),
        "symlink": lambda: (index.unlink(), index.symlink_to(elsewhere)),
        "group-writable": lambda: (index.write_bytes(good), index.chmod(0o660)),
        "over the bound": lambda: (
            index.write_bytes(good),
            monkeypatch.setattr(index_file, "MAX_INDEX_BYTES", 1000),
        ),
    }
    for name, damage in damages.items():
        if index.is_symlink() or index.exists():
            index.unlink()
        index.write_bytes(good)
        damage()
        assert _listed(tmp_path) == truth, name
        assert afk.Store(tmp_path).interrupted() == [], name
        monkeypatch.setattr(index_file, "MAX_INDEX_BYTES", 256 << 20)
        if name not in ("symlink", "group-writable"):
            data = index.read_bytes()
            assert meta_index_file.decode_index(data).version == meta_index_file.VERSION, name
    # Planted names: never a path, never twice, never a run that is not there.
    for stamped in (stamp, None):
        index.unlink()
        planted = ["../outside", "r-00003", "r-00003", "no-such-run", "..", "/etc"]
        index.write_bytes(_forged(store, planted, stamped))
        counts = io_count()
        listed = [i.run_id for i in afk.Store(tmp_path).iter_runs()]
        monkeypatch.undo()
        assert len(listed) == len(set(listed)) and "no-such-run" not in listed
        assert set(listed) <= {run_id for run_id, _ in truth}
        assert counts["meta stats"] <= len(truth) + 2
        if stamped is None:  # runs/ listed again: every run, in order
            assert [(run_id, "completed") for run_id in listed] == truth


def test_a_small_store_writes_no_index(tmp_path: Path) -> None:
    store = afk.Store(tmp_path)
    store.create("a").close()
    assert [i.run_id for i in store.runs(limit=5)] == ["a"]
    assert store.interrupted() == ["a"]  # created, no owner
    assert not (tmp_path / INDEX_NAME).exists()


def _status_index(root: Path, *, key: str | None = None) -> afk.Store:
    """A store of :data:`RUNS` runs, one of them (r-00007) running with no owner, and its
    ``runs.index`` on disk."""
    store = _build(root)
    paths = store.paths("r-00007")
    record_codec = RecordCodec(signer=signer_for(key)) if key else RecordCodec()
    meta = msgspec.structs.replace(
        new_run_meta("r-00007", entrypoint="jobs:job"), status=RunStatus.RUNNING, created_ms=7
    )
    paths.meta.write_bytes(codec.encode_meta(record_codec, meta))
    keyed = afk.Store(root, key=key) if key else afk.Store(root)
    assert keyed.interrupted() == ["r-00007"]  # the index is written
    assert (root / INDEX_NAME).is_file()
    return keyed


def test_a_flipped_bit_in_the_index_never_hides_an_interrupted_run(tmp_path: Path) -> None:
    """Issue 38 item 6: a status of ``runfing`` (one bit) was trusted while its run.meta
    kept its stat; the run left Store.interrupted(), the watcher and ``runs --status``."""
    _status_index(tmp_path)
    index = tmp_path / INDEX_NAME
    data = index.read_bytes()
    assert data.count(b"running") == 1
    index.write_bytes(data.replace(b"running", b"runfing"))
    store = afk.Store(tmp_path)
    assert store.interrupted() == ["r-00007"]
    assert [i.run_id for i in store.runs(status="running")] == ["r-00007"]


def test_an_index_planted_without_the_key_never_hides_a_running_run(tmp_path: Path) -> None:
    """Issue 38 item 6: an index saying ``completed`` for a running run, written by someone
    without the store's key, hid it from the watcher and ``runs --status running``."""
    store = _status_index(tmp_path, key="the key")
    true = store.meta_index().summaries()
    planted = {
        name: msgspec.structs.replace(s, status="completed") if name == "r-00007" else s
        for name, s in true.items()
    }
    order = meta_index_file.listing_order(planted)  # the best a forger without the key does
    (tmp_path / INDEX_NAME).write_bytes(
        meta_index_file.encode_index(None, [], order, planted, None)
    )
    keyed = afk.Store(tmp_path, key="the key")
    assert keyed.interrupted() == ["r-00007"]
    assert [i.run_id for i in keyed.runs(status="running")] == ["r-00007"]


def test_verify_reports_an_index_that_disagrees_with_its_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = _status_index(tmp_path)
    true = store.meta_index().summaries()
    lying = {
        name: msgspec.structs.replace(s, status="completed") if name == "r-00007" else s
        for name, s in true.items()
    }
    order = meta_index_file.listing_order(lying)
    (tmp_path / INDEX_NAME).write_bytes(meta_index_file.encode_index(None, [], order, lying, None))
    assert cli_main(["--root", str(tmp_path), "verify", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    (problem,) = report["index"]["problems"]
    assert "r-00007" in problem and "'completed'" in problem and "'running'" in problem


def test_the_index_s_names_stay_importable_from_meta_index() -> None:
    # MetaIndex was split into the parts under storage/index/; callers keep the old path.
    from afk_local.storage.index import changes, scan, sweeps  # noqa: PLC0415

    assert meta_index.MetaIndex.__mro__[1:5] == (
        sweeps.MetaSweeps,
        changes.IndexChanges,
        index_file.StoredIndex,
        scan.MetaScan,
    )
    for name in meta_index.__all__:
        assert getattr(meta_index, name) is not None, name
    assert meta_index.INDEX_MIN_RUNS == index_file.INDEX_MIN_RUNS
    assert meta_index.note_deletion is scan.note_deletion
    assert meta_index.AWAKE is sweeps.AWAKE
