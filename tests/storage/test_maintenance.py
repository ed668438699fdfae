"""Store maintenance (afk_local/storage/maintenance.py): one idle-run loop for gc and pack."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import afk_local as afk
from afk_local.storage.maintenance import on_idle_run
from afk_local.storage.ops.retention import RetentionPolicy
from afk_local.storage.rundir.ownership import acquire_lock
from afk_local.storage.rundir.read.reader import RunReader

KEY = "maintenance test key"


def _run(store: afk.Store, run_id: str, checkpoints: int = 3) -> None:
    with store.create(run_id) as run:
        for step in range(checkpoints):
            run.checkpoint("runtime_state", {"step": step}, step=step)


def _visit(store: afk.Store, run_id: str) -> tuple[list[str], list[str], list[str]]:
    """(worked on, locked, failures) of one on_idle_run call."""
    worked: list[str] = []
    locked: list[str] = []
    failed: list[str] = []

    def work(reader: RunReader) -> None:
        worked.append(reader.run_id)

    on_idle_run(
        store,
        run_id,
        work,
        locked=lambda: locked.append(run_id),
        failed=failed.append,
        verb="skipped",
    )
    return worked, locked, failed


def test_an_idle_run_is_worked_on_under_its_lock(tmp_path: Path) -> None:
    store = afk.Store(tmp_path)
    _run(store, "r")
    assert _visit(store, "r") == (["r"], [], [])
    acquire_lock(store.paths("r"), 0.0).release()  # and the lock was let go


def test_a_run_whose_owner_is_alive_is_only_reported_locked(tmp_path: Path) -> None:
    store = afk.Store(tmp_path)
    _run(store, "r")
    with store.resume_writer("r"):
        assert _visit(store, "r") == ([], ["r"], [])


def test_a_symlinked_run_directory_is_reported_never_followed(tmp_path: Path) -> None:
    elsewhere = afk.Store(tmp_path / "elsewhere")
    _run(elsewhere, "r")
    store = afk.Store(tmp_path / "store")
    store.runs_dir.mkdir(parents=True)
    os.symlink(elsewhere.paths("r").dir, store.runs_dir / "r")
    worked, locked, (failure,) = _visit(store, "r")
    assert (worked, locked) == ([], [])
    assert failure.startswith("skipped: ") and "symlink" in failure


def test_a_keyed_run_behind_its_head_record_is_not_touched(tmp_path: Path) -> None:
    store = afk.Store(tmp_path / "store", key=KEY, head_dir=tmp_path / "heads")
    _run(store, "r", checkpoints=3)
    newest = max(store.paths("r").dir.glob("*.ckpt"))
    newest.unlink()  # an acknowledged checkpoint gone: a rollback
    worked, _, (failure,) = _visit(store, "r")
    assert worked == []
    assert failure.startswith("skipped: ")


def test_gc_and_pack_report_the_same_locked_run(tmp_path: Path) -> None:
    store = afk.Store(tmp_path)
    _run(store, "r")
    with store.resume_writer("r"):
        assert store.gc(RetentionPolicy()).skipped_locked == ["r"]
        (report,) = store.pack(["r"])
        assert report.skipped and not report.errors


def test_pack_reports_a_symlinked_run_instead_of_following_it(tmp_path: Path) -> None:
    elsewhere = afk.Store(tmp_path / "elsewhere")
    _run(elsewhere, "r")
    store = afk.Store(tmp_path / "store")
    store.runs_dir.mkdir(parents=True)
    os.symlink(elsewhere.paths("r").dir, store.runs_dir / "r")
    (report,) = store.pack(["r"])
    assert report.packed_files == 0
    assert report.errors and report.errors[0].startswith("not packed: ")


def test_pack_of_an_unknown_run_is_reported(tmp_path: Path) -> None:
    (report,) = afk.Store(tmp_path).pack(["nope"])
    assert report.errors == [f"run 'nope' not found under {tmp_path}"]


def test_delete_refuses_a_live_run_and_removes_an_idle_one(tmp_path: Path) -> None:
    store = afk.Store(tmp_path)
    _run(store, "r")
    with store.resume_writer("r"), pytest.raises(afk.RunLockedError):
        store.delete("r")
    store.delete("r")
    assert not store.exists("r")
    with pytest.raises(afk.RunNotFoundError):
        store.delete("r")
