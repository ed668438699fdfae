"""Durability of the storage core under real SIGKILLs and injected I/O faults (DESIGN §4)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from proc import kill_after, run, spawn

import afk_local as afk
from afk_local.storage import fsio

# A child that writes checkpoints forever (or N of them) and prints each
# acknowledged seq. The payload is a pure function of the seq so the parent can
# check that the state it finds is exactly what was written for that seq.
WRITER = r"""
import sys, afk_local as afk
root, run_id, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
store = afk.Store(root)
run = store.resume_writer(run_id) if store.exists(run_id) else store.create(run_id)
def payload(seq):
    return {"seq": seq, "messages": [f"message {i} " * 20 for i in range(seq % 60)]}
for _ in range(count):
    seq = run.seq + 1
    run.checkpoint("runtime_state", payload(seq), step=seq)
    print(seq, flush=True)
"""


def payload(seq: int) -> dict[str, object]:
    return {"seq": seq, "messages": [f"message {i} " * 20 for i in range(seq % 60)]}


def _check_run(store: afk.Store, run_id: str, acked: int) -> None:
    if acked == 0 and not store.exists(run_id):
        return  # killed before it made the run (a slow start on a loaded machine)
    reader = store.open(run_id)
    latest = reader.latest()
    if acked == 0 and latest is None:
        return
    assert latest is not None
    assert latest.seq >= acked
    assert latest.payload == payload(latest.seq)
    for file in reader.checkpoint_files():
        assert not file.name.startswith(fsio.TEMP_PREFIX)


def test_random_sigkills_never_lose_an_acknowledged_checkpoint(tmp_path: Path, trials) -> None:
    root = str(tmp_path)
    store = afk.Store(root)
    rng = random.Random(1234)
    acked = 0
    for _ in range(trials(25, 500)):
        child = spawn(WRITER, root, "r", "100000")
        # Killed once it acknowledged a random number of checkpoints, not at a wall-clock
        # time: the SIGKILL lands somewhere in the writes that follow, however loaded the
        # machine is (a fixed time let slow children die before creating the run at all).
        killed = kill_after(child, acks=rng.randint(1, 30), seconds=120)
        assert killed.returncode == -9, killed.stderr
        if killed.lines:
            acked = int(killed.lines[-1])
        _check_run(store, "r", acked)
    # Every checkpoint that survived decodes to what was written for its seq.
    reader = store.open("r")
    history = reader.history()
    assert not reader.skipped
    assert all(c.payload == payload(c.seq) for c in history)
    assert history[-1].seq >= acked > 0


# The kill-point sweep: the child SIGKILLs itself at its N-th durable I/O call.
SCRIPTED = r"""
import sys, afk_local as afk
from afk_local.testing import kill_at_io_call
root, kill_at = sys.argv[1], int(sys.argv[2])
switch = kill_at_io_call(kill_at)
def payload(seq):
    return {"seq": seq, "messages": [f"message {i} " * 20 for i in range(seq % 60)]}
store = afk.Store(root)
run = store.create("r")
for seq in range(1, 5):
    run.checkpoint("runtime_state", payload(seq), step=seq)
    print(seq, flush=True)
run.pause("input", "question?")
run.close()
run = store.resume_writer("r")
for seq in range(6, 10):
    run.checkpoint("runtime_state", payload(seq), step=seq)
    print(seq, flush=True)
run.finish({"done": True})
print("finished", flush=True)
print("calls", switch.calls, flush=True)
"""


def test_kill_at_every_durable_io_call(tmp_path: Path, kill_points) -> None:
    """A real SIGKILL at each durable I/O call of a writer (``--torture``: every call; the
    default suite: 14 of them, see ``kill_points``; the crash explorer checks the writer's
    crash states deterministically)."""
    full = run(SCRIPTED, str(tmp_path / "count"), "0")
    assert full.returncode == 0, full.stderr
    total = int(full.stdout.split()[-1])
    assert total > 60
    for kill_at in kill_points(total, 14):
        root = tmp_path / f"k{kill_at}"
        result = run(SCRIPTED, str(root), str(kill_at))
        assert result.returncode == -9, (kill_at, result.stderr)
        lines = result.stdout.split()
        acked = max((int(x) for x in lines if x.isdigit()), default=0)
        store = afk.Store(root)
        if not store.exists("r"):
            assert acked == 0
            continue
        reader = store.open("r")
        latest = reader.latest()
        if latest is None:
            assert acked == 0, kill_at
        else:
            assert latest.seq >= acked, kill_at
            if latest.phase == "runtime_state":
                assert latest.payload == payload(latest.seq), kill_at
        # No later write corrupts it: resume, write on, and everything verifies.
        with store.resume_writer("r") as writer:
            seq = writer.seq + 1
            writer.checkpoint("runtime_state", payload(seq), step=seq)
        reader = store.open("r")
        assert reader.latest().payload == payload(seq), kill_at
        report = reader.verify()
        assert report.ok, (kill_at, report.problems)


class _FailNthFsync:
    def __init__(self, n: int) -> None:
        self.n = n
        self.seen = 0

    def __call__(self, op: str, path: str) -> None:
        if op == "fsync":
            self.seen += 1
            if self.seen == self.n:
                raise OSError(5, "Input/output error (injected)")


@pytest.mark.parametrize("nth", [1, 2])  # the file's fsync, then the directory's
def test_fsync_failure_is_fatal_for_the_writer(tmp_path: Path, nth: int) -> None:
    store = afk.Store(tmp_path)
    with store.create("r") as run:
        run.checkpoint("runtime_state", payload(1), step=1)
        run.checkpoint("runtime_state", payload(2), step=2)
        previous = fsio.set_io_hook(_FailNthFsync(nth))
        try:
            with pytest.raises(OSError, match="injected"):
                run.checkpoint("runtime_state", payload(3), step=3)
        finally:
            fsio.set_io_hook(previous)
        with pytest.raises(afk.WriterFailedError, match="resume_writer"):
            run.checkpoint("runtime_state", payload(3), step=3)
        with pytest.raises(afk.WriterFailedError):
            run.update_meta(version="x")
    reader = store.open("r")
    assert reader.latest().seq == 2
    assert reader.latest().payload == payload(2)
    assert reader.verify().ok
    with store.resume_writer("r") as run:
        assert run.checkpoint("runtime_state", payload(3), step=3).seq == 3


HOLDER = r"""
import sys, time, afk_local as afk
store = afk.Store(sys.argv[1])
run = store.create("r")
run.checkpoint("runtime_state", {"x": 1}, step=1)
print("ready", flush=True)
time.sleep(600)
"""


def test_lock_is_exclusive_across_processes_until_the_holder_dies(tmp_path: Path) -> None:
    store = afk.Store(tmp_path)
    child = spawn(HOLDER, str(tmp_path))
    try:
        assert child.stdout.readline().strip() == "ready"
        assert store.owner_alive("r")
        with pytest.raises(afk.RunLockedError, match=f"pid {child.pid}"):
            store.resume_writer("r")
        assert store.interrupted() == []
    finally:
        child.kill()
        child.wait()
    assert not store.owner_alive("r")
    assert store.interrupted() == ["r"]
    with store.resume_writer("r") as run:
        assert run.meta.owner.pid == os.getpid()
        run.checkpoint("runtime_state", {"x": 2}, step=2)
