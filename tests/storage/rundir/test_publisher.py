"""The publish protocol: temp, fsync, rename, ``latest`` swap, one directory fsync."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from afk_local.storage import fsio
from afk_local.storage.format.layout import RunPaths, checkpoint_name
from afk_local.storage.rundir.write.publisher import Publisher


def _paths(tmp_path: Path) -> RunPaths:
    return RunPaths("r", tmp_path)


def test_publish_leaves_no_temp_file_and_latest_names_the_new_file(tmp_path: Path) -> None:
    publisher = Publisher(_paths(tmp_path))
    for seq in (1, 2):
        publisher.publish(checkpoint_name(seq, "runtime_state"), b"state %d" % seq)
    publisher.close()
    names = sorted(os.listdir(tmp_path))
    assert names == [
        checkpoint_name(1, "runtime_state"),
        checkpoint_name(2, "runtime_state"),
        "latest",
    ]
    assert os.readlink(tmp_path / "latest") == checkpoint_name(2, "runtime_state")
    assert (tmp_path / checkpoint_name(2, "runtime_state")).read_bytes() == b"state 2"


def test_a_publish_is_two_fsyncs_file_then_directory(tmp_path: Path) -> None:
    calls: list[tuple[str, str]] = []
    previous = fsio.set_io_hook(lambda operation, path: calls.append((operation, path)))
    try:
        Publisher(_paths(tmp_path)).publish("000000000001.runtime_state.ckpt", b"x")
    finally:
        fsio.set_io_hook(previous)
    operations = [operation for operation, _ in calls]
    assert operations.count("fsync") == 2
    # the file's fsync comes before its rename; the directory's after the latest swap
    assert operations.index("fsync") < operations.index("rename")
    assert calls[-1] == ("fsync", str(tmp_path) + os.sep)


def test_the_while_syncing_hook_runs_once_per_publish(tmp_path: Path) -> None:
    started: list[int] = []
    publisher = Publisher(_paths(tmp_path), while_syncing=lambda: started.append(1))
    publisher.publish("000000000001.runtime_state.ckpt", b"x")
    publisher.publish("000000000002.runtime_state.ckpt", b"y")
    assert started == [1, 1]


def test_unpublish_takes_the_file_back_and_latest_names_the_acknowledged_one(
    tmp_path: Path,
) -> None:
    publisher = Publisher(_paths(tmp_path))
    first, second = checkpoint_name(1, "runtime_state"), checkpoint_name(2, "runtime_state")
    publisher.publish(first, b"one")
    publisher.publish(second, b"two")
    publisher.unpublish(second, acknowledged_seq=1)
    assert not (tmp_path / second).exists()
    assert os.readlink(tmp_path / "latest") == first
    assert not [n for n in os.listdir(tmp_path) if n.startswith(fsio.TEMP_PREFIX)]


def test_unpublish_of_the_first_checkpoint_removes_latest(tmp_path: Path) -> None:
    publisher = Publisher(_paths(tmp_path))
    first = checkpoint_name(1, "runtime_state")
    publisher.publish(first, b"one")
    publisher.unpublish(first, acknowledged_seq=0)
    assert os.listdir(tmp_path) == []


def test_a_failed_publish_leaves_no_temp_file(tmp_path: Path) -> None:
    def fail_fsync(operation: str, path: str) -> None:
        if operation == "fsync":
            raise OSError("disk gone")

    previous = fsio.set_io_hook(fail_fsync)
    try:
        with pytest.raises(OSError, match="disk gone"):
            Publisher(_paths(tmp_path)).publish("000000000001.runtime_state.ckpt", b"x")
    finally:
        fsio.set_io_hook(previous)
    assert os.listdir(tmp_path) == []


def test_remove_temp_files_clears_what_a_crash_left(tmp_path: Path) -> None:
    (tmp_path / f"{fsio.TEMP_PREFIX}a.ckpt").write_bytes(b"half")
    os.symlink("000000000001.runtime_state.ckpt", tmp_path / f"{fsio.TEMP_PREFIX}latest")
    (tmp_path / f"{fsio.TEMP_PREFIX}dir").mkdir()
    (tmp_path / "000000000001.runtime_state.ckpt").write_bytes(b"kept")
    assert Publisher(_paths(tmp_path)).remove_temp_files() == 3
    assert os.listdir(tmp_path) == ["000000000001.runtime_state.ckpt"]


def test_a_run_directory_swapped_for_a_symlink_does_not_lead_a_publish_out_of_it(
    tmp_path: Path,
) -> None:
    """The publisher names its files relative to the directory it opened (openat,
    renameat, symlinkat): a run directory replaced by a symlink to somewhere else while
    the writer is open (a hostile or confused process) does not draw the checkpoint,
    its temp file or ``latest`` out of the store; they stay in the opened directory."""
    run_dir, moved, elsewhere = tmp_path / "run", tmp_path / "moved", tmp_path / "elsewhere"
    run_dir.mkdir()
    elsewhere.mkdir()
    publisher = Publisher(RunPaths("r", run_dir))
    publisher.publish(checkpoint_name(1, "runtime_state"), b"one")
    run_dir.rename(moved)
    run_dir.symlink_to(elsewhere)
    publisher.publish(checkpoint_name(2, "runtime_state"), b"two")
    publisher.close()
    assert os.listdir(elsewhere) == []
    assert sorted(os.listdir(moved)) == [
        checkpoint_name(1, "runtime_state"),
        checkpoint_name(2, "runtime_state"),
        "latest",
    ]
    assert os.readlink(moved / "latest") == checkpoint_name(2, "runtime_state")
