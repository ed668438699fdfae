"""Creating a run directory (afk_local/storage/rundir/write/creation.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from afk_local.errors import RunExistsError, UntrustedStoreError
from afk_local.storage.format.layout import RunPaths
from afk_local.storage.format.records import RunStatus
from afk_local.storage.rundir.write.creation import begin_run_dir, new_run_meta, refuse_linked_dirs


def _paths(root: Path, run_id: str = "r") -> RunPaths:
    return RunPaths(run_id, root / "runs" / run_id)


def make_run_dir(paths: RunPaths, runs_dir: Path) -> None:
    new_run = begin_run_dir(paths, runs_dir)
    try:
        new_run.publish(b"meta")
    finally:
        new_run.lock.release()


def test_a_new_run_directory_is_made_private(tmp_path: Path) -> None:
    paths = _paths(tmp_path)
    make_run_dir(paths, tmp_path / "runs")
    assert paths.dir.is_dir()
    assert paths.dir.stat().st_mode & 0o077 == 0


def test_a_new_run_is_not_in_the_store_until_published(tmp_path: Path) -> None:
    paths = _paths(tmp_path)
    new_run = begin_run_dir(paths, tmp_path / "runs")
    try:
        assert not paths.dir.exists()
        new_run.publish(b"meta", checkpoint=("000000000001.run_started.ckpt", b"c"), journal=True)
    finally:
        new_run.lock.release()
    assert sorted(p.name for p in paths.dir.iterdir()) == [
        "000000000001.run_started.ckpt",
        "effects.log",
        "latest",
        "owner.lock",
        "run.meta",
    ]
    assert [p.name for p in paths.dir.parent.iterdir()] == ["r"]  # no temporary left


def test_a_second_creator_of_one_run_id_gets_run_exists(tmp_path: Path) -> None:
    paths = _paths(tmp_path)
    first = begin_run_dir(paths, tmp_path / "runs")
    second = begin_run_dir(paths, tmp_path / "runs")  # neither is published yet
    try:
        first.publish(b"meta")
        with pytest.raises(RunExistsError):
            second.publish(b"other")
        second.abandon()
    finally:
        first.lock.release()
        second.lock.release()
    assert paths.meta.read_bytes() == b"meta"
    assert [p.name for p in paths.dir.parent.iterdir()] == ["r"]


def test_an_empty_directory_a_crash_left_is_adopted(tmp_path: Path) -> None:
    paths = _paths(tmp_path)
    paths.dir.mkdir(parents=True)  # an older version's mkdir happened, its run.meta did not
    (paths.dir / "owner.lock").write_bytes(b"")
    make_run_dir(paths, tmp_path / "runs")
    assert paths.meta.read_bytes() == b"meta"


def test_a_directory_with_a_meta_is_not_taken(tmp_path: Path) -> None:
    paths = _paths(tmp_path)
    paths.dir.mkdir(parents=True)
    paths.meta.write_bytes(b"x")
    with pytest.raises(RunExistsError):
        make_run_dir(paths, tmp_path / "runs")


def test_a_symlinked_run_directory_is_never_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    paths = _paths(tmp_path)
    paths.dir.parent.mkdir(parents=True)
    paths.dir.symlink_to(outside)
    with pytest.raises(UntrustedStoreError, match="not a directory"):
        make_run_dir(paths, tmp_path / "runs")
    with pytest.raises(UntrustedStoreError):
        refuse_linked_dirs(tmp_path / "runs", paths)
    assert list(outside.iterdir()) == []


def test_a_new_meta_is_created_and_checks_its_parent_id() -> None:
    meta = new_run_meta("r", params={"n": 1}, parent_run_id="p")
    assert (meta.run_id, meta.status, meta.params, meta.parent_run_id) == (
        "r",
        RunStatus.CREATED,
        {"n": 1},
        "p",
    )
    assert meta.created_ms == meta.updated_ms
    with pytest.raises(Exception, match="run id"):
        new_run_meta("r", parent_run_id="../x")
