"""verify (afk_local/storage/rundir/read/verify.py): a ``latest`` pointing below the newest
checkpoint, and files a concurrent rewrite moved."""

from __future__ import annotations

from pathlib import Path

import pytest

import afk_local as afk
from afk_local.storage import fsio
from afk_local.storage.format.records import RunMeta
from afk_local.storage.ops.retention import RetentionPolicy
from afk_local.storage.rundir.read.loading import RunLoader
from afk_local.storage.rundir.read.reader import RunReader
from afk_local.storage.rundir.write.writer import RunWriter


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


def test_a_new_attempt_repairs_a_latest_two_kills_left_behind(tmp_path: Path) -> None:
    """Issue 38 item 5: two kills between a checkpoint's rename and the swap of latest
    leave it two behind; the next attempt moves it on instead of leaving a rollback."""
    store = afk.Store(tmp_path)
    _run(store, finish=False)
    _point_latest_at(store, 3)
    assert not store.open("r").verify().ok  # as two kills leave it
    store.resume_writer("r").close()
    assert store.open("r").verify().ok
    assert store.open("r").latest().seq == 5  # type: ignore[union-attr]


def test_verify_during_gc_does_not_call_the_files_gc_removed_damaged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 38 item 4: gc deletes loose checkpoints (no pack, no MANIFEST changes): verify
    must tell a file a rewrite removed while it read from a lost one."""
    store = afk.Store(tmp_path)
    with store.create("r") as run:
        for i in range(1, 12):
            run.checkpoint("runtime_state", {"i": i, "pad": "x" * 200}, step=i)
        run.finish("done")
    loads = RunReader.load_chained
    ran: list[object] = []

    def gc_in_between(self: RunReader, *args: object, **kwargs: object) -> bytes | None:
        if not ran:  # verify has listed the files: gc now removes most of them
            ran.append(store.gc(RetentionPolicy(keep_runtime_states=1)))
        return loads(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(RunReader, "load_chained", gc_in_between)
    report = store.open("r").verify()
    assert ran and report.ok, report.problems


def test_verify_still_reports_a_checkpoint_lost_outside_any_rewrite(tmp_path: Path) -> None:
    store = afk.Store(tmp_path)
    _run(store, finish=False)
    (file,) = [f for f in store.open("r").checkpoint_files() if f.seq == 2]
    reader = store.open("r")
    listed = reader.checkpoint_files()
    (store.paths("r").dir / file.name).unlink()  # gone, no rewrite ran: a delta base is lost
    assert listed and not store.open("r").verify().ok


def test_verify_beside_a_new_attempt_of_a_keyed_run_reports_no_rollback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The interleaving the fuzzer met (seed i38-torture, program 241: verify in a thread
    beside an attempt): verify reads run.meta, then a new attempt replaces it (a new
    attempt count, no checkpoint, so no rewrite to notice) and moves the head record,
    then verify reads the head. The run moved forward; it was not put back."""
    store = afk.Store(tmp_path / "store", key="verify test key", head_dir=tmp_path / "heads")
    with store.create("r") as run:
        run.checkpoint("runtime_state", {"i": 1}, step=1)
        run.fail(ValueError("the first attempt fails"))
    real_read_meta = RunLoader.read_meta
    reads: list[int] = []
    attempts: list[RunWriter] = []

    def read_meta_with_an_attempt_starting(self: RunLoader) -> RunMeta:
        meta = real_read_meta(self)
        reads.append(meta.updated_ms)
        if len(reads) == 2:  # the read for the head check: the attempt starts right after
            attempts.append(store.resume_writer("r"))
        return meta

    monkeypatch.setattr(RunLoader, "read_meta", read_meta_with_an_attempt_starting)
    report = store.open("r", lazy=True).verify()
    assert attempts
    attempts[0].close()
    assert report.ok, report.problems
