"""A job that fills its disk stops with one line naming the disk, and resumes once there is room.

Real processes on a real full filesystem: a 3 MiB tmpfs (mounted here, so the test
needs root; it skips with the reason otherwise) holds the store and a ballast file;
a script job grows its state until a write fails with ENOSPC. ``afk-local resume``
while the disk is still full says so in one line; after the ballast is deleted the
same command finishes the run with every acknowledged item kept.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import proc
import pytest

SCRIPT = textwrap.dedent(
    """
    import hashlib, sys
    import afk_local as afk

    @afk.durable(store=sys.argv[1])
    def grow(ctx, n):
        ctx.state.setdefault("blobs", [])
        for i in ctx.iterate(range(n), progress=False):
            blob = hashlib.shake_256(str(i).encode()).digest(100_000)  # incompressible
            ctx.state["blobs"].append(blob)
            ctx.checkpoint()
            print("ack", i, flush=True)
        return [hashlib.sha256(b).hexdigest() for b in ctx.state["blobs"]]

    if __name__ == "__main__":
        print("result", grow.run(int(sys.argv[2]), run_id="grow"), flush=True)
    """
)

N = 12


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A fresh 3 MiB tmpfs at ``tmp_path/disk``, unmounted afterwards."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=3m,mode=0700", "tmpfs", str(disk)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


def afk_local(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return proc.python(["-m", "afk_local", "--root", str(root), *args], env=env(), timeout=120)


def digest(i: int) -> str:
    return hashlib.sha256(hashlib.shake_256(str(i).encode()).digest(100_000)).hexdigest()


def test_a_full_disk_is_one_line_and_the_run_completes_once_space_is_freed(
    tmp_path: Path, small_disk: Path
) -> None:
    root = small_disk / ".afk"
    ballast = small_disk / "ballast"
    ballast.write_bytes(os.urandom(2 * 1024 * 1024))  # the store gets about 1 MiB
    script = tmp_path / "grow.py"
    script.write_text(SCRIPT)

    first = subprocess.run(
        [sys.executable, str(script), str(root), str(N)],
        capture_output=True,
        text=True,
        env=env(),
        timeout=120,
        cwd=tmp_path,
    )

    acked = [int(line.split()[1]) for line in first.stdout.splitlines() if line.startswith("ack")]
    assert first.returncode == 1, first.stdout
    assert 0 < len(acked) < N
    # the job's own traceback ends in one line naming the disk; no raw OSError chained to it
    last = first.stderr.strip().splitlines()[-1]
    assert last.startswith(f"afk_local.errors.DiskFullError: the disk mounted at {small_disk} ")
    assert "free space on it" in last and "resume_writer" not in first.stderr
    assert "[Errno 28]" not in first.stderr and "During handling" not in first.stderr

    still_full = afk_local(root, "resume", "grow")

    assert still_full.returncode == 1
    assert still_full.stdout == ""
    lines = still_full.stderr.splitlines()
    assert len(lines) == 1, still_full.stderr
    assert lines[0].startswith(f"afk-local: run 'grow' stopped: the disk mounted at {small_disk} ")
    assert "then resume the run" in lines[0]

    ballast.unlink()
    done = afk_local(root, "resume", "grow", "--json")

    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout)
    assert outcome["status"] == "completed"
    assert outcome["result"] == [digest(i) for i in range(N)]  # every acknowledged item kept
    verified = afk_local(root, "verify", "grow")
    assert verified.returncode == 0, verified.stdout + verified.stderr
