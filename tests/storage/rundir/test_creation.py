"""Creating a run directory (afk_local/storage/rundir/creation.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from afk_local.errors import RunExistsError, UntrustedStoreError
from afk_local.storage.format.layout import RunPaths
from afk_local.storage.format.records import RunStatus
from afk_local.storage.rundir.creation import make_run_dir, new_run_meta, refuse_linked_dirs


def _paths(root: Path, run_id: str = "r") -> RunPaths:
    return RunPaths(run_id, root / "runs" / run_id)


def test_a_new_run_directory_is_made_private(tmp_path: Path) -> None:
    paths = _paths(tmp_path)
    make_run_dir(paths, tmp_path / "runs")
    assert paths.dir.is_dir()
    assert paths.dir.stat().st_mode & 0o077 == 0


def test_an_empty_directory_a_crash_left_is_adopted(tmp_path: Path) -> None:
    paths = _paths(tmp_path)
    paths.dir.mkdir(parents=True)  # mkdir happened, the first run.meta did not
    make_run_dir(paths, tmp_path / "runs")
    assert paths.dir.is_dir()


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
