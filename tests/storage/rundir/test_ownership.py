"""Ownership (afk_local/storage/rundir/ownership.py): probing who owns a run never fails the owner,
and a planted ``owner.lock`` is damage, never a live owner."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import proc
import pytest

import afk_local as afk
from afk_local.storage.format.records import RunStatus
from afk_local.storage.rundir.ownership import OwnerProbe, is_interrupted

# Asks "is its owner alive?" as fast as it can, like `afk-local runs` in a loop or a watcher.
PROBER = """
import sys, afk_local as afk
store = afk.Store(sys.argv[1])
print("probing", flush=True)
while True:
    store.owner_alive(sys.argv[2])
    store.runs()
"""

# Opens the run for writing with lock_timeout=0 (the default) again and again.
WRITER = """
import sys, afk_local as afk
store = afk.Store(sys.argv[1])
refused = 0
for _ in range(int(sys.argv[3])):
    try:
        with store.resume_writer(sys.argv[2]):
            pass
    except afk.RunLockedError:
        refused += 1
print(refused, flush=True)
"""


def test_probing_never_fails_an_owner_opening_with_lock_timeout_0(tmp_path: Path, trials) -> None:
    store = afk.Store(tmp_path / "store")
    with store.create("r") as run:
        run.checkpoint("runtime_state", {"i": 1}, step=1)
    probers = [proc.spawn(PROBER, str(store.root), "r") for _ in range(2)]
    try:
        for prober in probers:
            assert prober.stdout is not None and prober.stdout.readline().strip() == "probing"
        tries = trials(300, 3000)
        done = proc.run(WRITER, str(store.root), "r", str(tries))
        assert done.returncode == 0, done.stderr
        assert int(done.stdout) == 0, f"{done.stdout.strip()} of {tries} opens refused"
    finally:
        for prober in probers:
            prober.kill()
            prober.wait()


# What `afk-local runs` and `verify` see, in a child so that a probe that blocks shows as a timeout.
LOOK = """
import json, sys, afk_local as afk
store = afk.Store(sys.argv[1])
info = store.info("r")
report = store.open("r").verify()
print(json.dumps({"alive": info.owner_alive, "problem": getattr(info, "lock_problem", None),
                  "verify": [p.reason for p in report.problems if p.path.endswith("owner.lock")]}))
"""


def _plant(lock: Path, kind: str, tmp_path: Path) -> None:
    lock.unlink(missing_ok=True)
    if kind == "symlink":
        target = tmp_path / "elsewhere"
        target.write_text("")
        lock.symlink_to(target)
    elif kind == "fifo":
        os.mkfifo(lock)
    elif kind == "directory":
        lock.mkdir()
    else:  # unreadable: another account's file, or mode 000
        lock.write_text("")
        lock.chmod(0)


@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory", "unreadable"])
def test_planted_owner_lock_is_reported_as_damage_never_as_a_live_owner(
    tmp_path: Path, kind: str
) -> None:
    if kind == "unreadable" and os.geteuid() == 0:
        pytest.skip("root reads a mode-000 file")
    store = afk.Store(tmp_path / "store")
    with store.create("r") as run:
        run.checkpoint("runtime_state", {"i": 1}, step=1)
    _plant(store.paths("r").lock, kind, tmp_path)
    child = proc.spawn(LOOK, str(store.root))
    try:
        out, err = child.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        pytest.fail("probing the planted owner.lock blocked")
    assert child.returncode == 0, err
    seen = json.loads(out)
    assert seen["alive"] is False, seen
    assert seen["problem"] and seen["verify"], seen
    with pytest.raises(afk.AfkLocalError, match=r"owner\.lock"):
        store.resume_writer("r")  # a planted lock file is refused, never followed or used


@pytest.mark.parametrize("status", list(RunStatus))
@pytest.mark.parametrize(
    "owner", [OwnerProbe(False), OwnerProbe(True), OwnerProbe(False, "owner.lock is a FIFO")]
)
def test_is_interrupted_is_a_free_lock_under_a_status_that_expects_an_owner(
    status: RunStatus, owner: OwnerProbe
) -> None:
    """The one definition: running or created, nobody holds the lock, the lock is usable."""
    expected = status in (RunStatus.RUNNING, RunStatus.CREATED) and owner == OwnerProbe(False)
    assert is_interrupted(status, owner) is expected
