"""A read-only store: one line saying what is read-only and what still works.

Real processes on a read-only directory: a read-only bind mount when the tests run as
root (root writes through permission bits), else a directory without write permission.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import test_script_jobs
from proc import REPO
from test_script_jobs import N, make_project, start_and_kill


@pytest.fixture(autouse=True)
def this_afk_local(monkeypatch: pytest.MonkeyPatch) -> None:
    plain = test_script_jobs.no_pythonpath

    def env() -> dict[str, str]:
        return {**plain(), "PYTHONPATH": str(REPO)}

    monkeypatch.setattr(test_script_jobs, "no_pythonpath", env)


@contextlib.contextmanager
def read_only(directory: Path) -> Iterator[None]:
    """``directory`` (and everything under it) read-only while the block runs."""
    if os.geteuid() != 0:
        modes = {p: p.stat().st_mode for p in [directory, *directory.rglob("*")] if p.is_dir()}
        for p, mode in modes.items():
            p.chmod(stat.S_IMODE(mode) & ~0o222)
        try:
            yield
        finally:
            for p, mode in modes.items():
                p.chmod(stat.S_IMODE(mode))
        return
    if shutil.which("mount") is None:
        pytest.skip("no mount(8) to make a read-only bind mount")
    subprocess.run(["mount", "--bind", str(directory), str(directory)], check=True)
    try:
        done = subprocess.run(
            ["mount", "-o", "remount,ro,bind", str(directory)], capture_output=True, text=True
        )
        if done.returncode != 0:
            pytest.skip(f"cannot remount read-only here: {done.stderr.strip()}")
        yield
    finally:
        subprocess.run(["umount", str(directory)], check=True)


def run(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=project, capture_output=True, text=True,
        env=test_script_jobs.no_pythonpath(), timeout=120,
    )  # fmt: skip


CHECKPOINT = "import afk_local as afk; afk.StateCheckpoint('ckpt').save({'i': 2})"


def test_a_read_only_store_says_so_in_one_line_and_still_reads(tmp_path: Path) -> None:
    project = make_project(tmp_path)
    start_and_kill(project, acks=3)
    saved = run(project, "-c", CHECKPOINT.replace("2", "1"))
    assert saved.returncode == 0, saved.stderr

    with read_only(project):
        script = run(project, "my_job.py", str(N), "0.05")  # the README's "run it again"
        assert script.returncode == 1
        [line] = script.stderr.splitlines()
        assert line.startswith(f"StoreReadOnlyError: the store {project / '.afk'} is read-only")
        assert "reading still works" in line

        saved = run(project, "-c", CHECKPOINT)
        assert saved.returncode == 1
        assert len(saved.stderr.splitlines()) == 1, saved.stderr
        [line] = saved.stderr.splitlines()
        assert line.startswith(f"StoreReadOnlyError: the store {project / 'ckpt'} is read-only")

        resumed = run(project, "-m", "afk_local", "resume", "script-job")
        assert resumed.returncode == 2
        [line] = resumed.stderr.splitlines()
        assert "is read-only" in line and "gc --dry-run" in line
        assert resumed.stdout == ""

        planned = run(project, "-m", "afk_local", "gc", "--dry-run")
        assert planned.returncode == 0, planned.stderr
        assert "dry run: 1 run(s) checked" in planned.stdout
        assert "error" not in planned.stdout + planned.stderr

        collected = run(project, "-m", "afk_local", "gc")
        assert collected.returncode == 2
        [line] = collected.stderr.splitlines()
        assert "is read-only" in line
        assert collected.stdout == ""

        listed = run(project, "-m", "afk_local", "runs")
        assert listed.returncode == 0, listed.stderr
        assert "script-job" in listed.stdout

    resumed = run(project, "-m", "afk_local", "resume", "script-job")  # writable again
    assert resumed.returncode == 0, resumed.stderr
