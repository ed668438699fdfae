"""DurableWriter: ordering, coalescing, snapshots, error surfacing, and crashes per mode."""

from __future__ import annotations

import errno
import random
import subprocess
import threading

import proc
import pytest

import afk_local as afk
from afk_local.runner.writer import DurableWriter, FlushTimeoutError
from afk_local.storage import fsio


@pytest.fixture
def store(tmp_path):
    return afk.Store(tmp_path / "s")


def _phases_and_payloads(store, run_id):
    return [(c.phase, c.payload) for c in store.open(run_id).history()]


@pytest.mark.parametrize("mode", ["sync", "async", "exit"])
def test_checkpoints_land_in_order(store, mode):
    writer = DurableWriter(store.create("r"), mode)
    for i in range(20):
        writer.checkpoint("step_started", {"i": i}, step=i)
    writer.finish("ok")
    writer.close()
    history = _phases_and_payloads(store, "r")
    assert [p for _, p in history[:-1]] == [{"i": i} for i in range(20)]
    assert history[-1][0] == "run_terminal"
    assert store.read_meta("r").status is afk.RunStatus.COMPLETED


def test_exit_mode_coalesces_consecutive_runtime_state_only(store):
    writer = DurableWriter(store.create("r"), "exit")
    for i in range(5):
        writer.checkpoint("runtime_state", {"i": i}, step=i)
    writer.checkpoint("step_started", {"mark": 1}, step=5)
    for i in range(5, 8):
        writer.checkpoint("runtime_state", {"i": i}, step=i)
    assert store.open("r").history() == []  # nothing written before a flush in exit mode
    writer.flush()
    assert _phases_and_payloads(store, "r") == [
        ("runtime_state", {"i": 4}),
        ("step_started", {"mark": 1}),
        ("runtime_state", {"i": 7}),
    ]
    assert writer.coalesced == 6
    writer.close()


@pytest.mark.parametrize("mode", ["async", "exit"])
def test_payload_is_snapshotted_at_checkpoint_time(store, mode):
    writer = DurableWriter(store.create("r"), mode)
    state = {"items": [1]}
    writer.checkpoint("runtime_state", state, step=1)
    state["items"].append(2)  # the caller keeps mutating after checkpoint() returned
    writer.close()
    assert store.open("r").latest().payload == {"items": [1]}


@pytest.mark.parametrize("mode", ["async", "exit"])
def test_unencodable_payload_raises_in_the_caller(store, mode):
    writer = DurableWriter(store.create("r"), mode)
    with pytest.raises(TypeError):
        writer.checkpoint("runtime_state", {"x": object()}, step=1)
    writer.checkpoint("runtime_state", {"x": 1}, step=1)  # the writer is still fine
    writer.close()
    assert store.open("r").latest().payload == {"x": 1}


def _failing_fsync(after: int):
    calls = {"n": 0, "after_failure": 0}

    def hook(operation, path):
        if operation != "fsync":
            return
        calls["n"] += 1
        if calls["n"] > after:
            calls["after_failure"] += 1
            raise OSError(errno.EIO, "injected fsync failure", path)

    return hook, calls


@pytest.mark.parametrize("mode", ["sync", "async", "exit"])
def test_fsync_failure_is_fatal_and_surfaces(store, mode):
    writer = DurableWriter(store.create("r"), mode)
    hook, calls = _failing_fsync(after=0)
    previous = fsio.set_io_hook(hook)
    try:
        with pytest.raises(OSError, match="injected"):
            writer.checkpoint("runtime_state", {"i": 1}, step=1)
            writer.flush()
        failures = calls["after_failure"]
        # never retried: later calls refuse without touching the disk
        with pytest.raises(afk.WriterFailedError):
            writer.checkpoint("runtime_state", {"i": 2}, step=2)
        with pytest.raises(afk.WriterFailedError):
            writer.finish("nope")
        assert calls["after_failure"] == failures == 1
    finally:
        fsio.set_io_hook(previous)
        writer.close()
    assert store.read_meta("r").status is not afk.RunStatus.COMPLETED


def test_async_flush_is_bounded(store):
    writer = DurableWriter(store.create("r"), "async", flush_timeout_s=0.2)
    release = threading.Event()

    def hook(operation, path):
        if operation == "fsync" and threading.current_thread().name.startswith("afk-writer"):
            release.wait(10)

    previous = fsio.set_io_hook(hook)
    try:
        writer.checkpoint("runtime_state", {"i": 1}, step=1)
        with pytest.raises(FlushTimeoutError, match="not written within"):
            writer.flush()
    finally:
        release.set()
        fsio.set_io_hook(previous)
    writer.close()
    assert store.open("r").latest().payload == {"i": 1}


@pytest.mark.parametrize("mode", ["sync", "async", "exit"])
def test_effects_are_synchronous_in_every_mode(store, mode):
    writer = DurableWriter(store.create("r"), mode)
    assert writer.effects.call("k#1", lambda: 41) == 41
    # readable by a fresh reader before any flush or close
    assert [e.kind for e in store.open("r").effects()] == ["intent", "outcome"]
    writer.close()


_CRASH_CHILD = """
import sys, afk_local as afk
from afk_local.runner.writer import DurableWriter
store = afk.Store(sys.argv[1])
writer = DurableWriter(store.create("r"), sys.argv[2])
for i in range(400):
    writer.effects.call(f"e#{i}", lambda i: i, (i,))
    print(f"effect {i}", flush=True)
    writer.checkpoint("runtime_state", {"i": i, "pad": "x" * 200}, step=i)
    if sys.argv[2] == "sync":
        print(f"ckpt {i}", flush=True)
"""


@pytest.mark.parametrize("mode", ["sync", "async", "exit"])
def test_sigkill_loses_no_acknowledged_effect(tmp_path, mode, trials):
    for trial in range(trials(3, 30)):
        root = tmp_path / f"s{trial}"
        child = proc.spawn(_CRASH_CHILD, str(root), mode)
        killed = proc.kill_after(child, acks=random.randint(5, 300))
        acked = [int(x.split()[1]) for x in killed.lines if x.startswith("effect")]
        ckpts = [int(x.split()[1]) for x in killed.lines if x.startswith("ckpt")]
        store = afk.Store(root)
        reader = store.open("r")
        outcomes = {e.key for e in reader.effects() if e.kind == "outcome"}
        assert {f"e#{i}" for i in acked} <= outcomes
        latest = reader.latest()
        if ckpts:  # sync: an acknowledged checkpoint survives
            assert latest is not None and latest.payload["i"] >= ckpts[-1]
        if latest is not None and latest.phase == "runtime_state":
            assert latest.payload["pad"] == "x" * 200  # never torn
        assert reader.verify().ok


def test_exit_mode_writes_at_interpreter_exit(tmp_path):
    script = """
import sys, afk_local as afk
from afk_local.runner.writer import DurableWriter
writer = DurableWriter(afk.Store(sys.argv[1]).create("r"), "exit")
for i in range(10):
    writer.checkpoint("runtime_state", {"i": i}, step=i)
# no close(): the process simply ends
"""
    done = proc.run(script, str(tmp_path / "s"))
    assert done.returncode == 0, done.stderr
    assert afk.Store(tmp_path / "s").open("r").latest().payload == {"i": 9}


def test_invalid_mode(store):
    run = store.create("r")
    with pytest.raises(ValueError, match="durability"):
        DurableWriter(run, "sometimes")
    run.close()


# An async writer on a stuck disk: close() gives up waiting (flush timeout), while the
# background thread is still inside its write. The process lives on (a notebook, a server).
STUCK_OWNER = """
import sys, threading, time, afk_local as afk
from afk_local.runner.writer import DurableWriter, FlushTimeoutError
from afk_local.storage import fsio
store, stall = afk.Store(sys.argv[1]), float(sys.argv[2])
writer = DurableWriter(store.create("r"), "async", flush_timeout_s=0.2)
writer.checkpoint("runtime_state", {"by": "first owner", "n": 1}, step=1)
writer.flush()
def stuck_disk(operation, path):
    if operation == "fsync" and threading.current_thread().name.startswith("afk-writer"):
        time.sleep(stall)
fsio.set_io_hook(stuck_disk)
writer.checkpoint("runtime_state", {"by": "first owner", "n": 2}, step=2)
try:
    writer.close()
except FlushTimeoutError:
    print("closed", flush=True)
time.sleep(stall + 1)
"""

# Takes the run over as soon as its lock is free and acknowledges one checkpoint.
NEXT_OWNER = """
import sys, time, afk_local as afk
store = afk.Store(sys.argv[1])
deadline = time.monotonic() + 60
while True:
    try:
        run = store.resume_writer("r")
        break
    except afk.RunLockedError:
        assert time.monotonic() < deadline
        time.sleep(0.01)
record = run.checkpoint("runtime_state", {"by": "next owner"}, step=9)
print(record.seq, flush=True)
run.close()
"""


def test_close_after_a_flush_timeout_keeps_the_lock_until_the_last_write_ends(tmp_path, trials):
    """A new owner never has its acknowledged checkpoints overwritten by the old one's thread."""
    for trial in range(trials(1, 5)):
        root = tmp_path / f"s{trial}"
        owner = proc.spawn(STUCK_OWNER, str(root), "1.5")
        try:
            assert owner.stdout is not None
            assert owner.stdout.readline().strip() == "closed", owner.stderr
            taken = proc.run(NEXT_OWNER, str(root))
            assert taken.returncode == 0, taken.stderr
            acked = int(taken.stdout)
            owner.wait(timeout=60)
        finally:
            if owner.poll() is None:
                owner.kill()
                owner.wait()
        reader = afk.Store(root).open("r")
        assert reader.get(acked).payload == {"by": "next owner"}
        assert reader.verify().ok, reader.verify().problems


# os.fork() while a writer is open: the child inherits the writer, its queue and its
# atexit hook. It must never write into the parent's run: not at exit, not on demand.
FORKING_OWNER = """
import os, sys, threading, time, afk_local as afk
from afk_local.runner.writer import DurableWriter
from afk_local.storage import fsio
root, mode, done = sys.argv[1], sys.argv[2], sys.argv[3]
store = afk.Store(root)
writer = DurableWriter(store.create("r"), mode, flush_timeout_s=60)
writer.checkpoint("runtime_state", {"n": 1}, step=1)
writer.flush()
if mode == "async":  # fork while the background thread is busy with a queued write
    started = threading.Event()
    def slow_disk(operation, path):
        if operation == "fsync" and threading.current_thread().name.startswith("afk-writer"):
            started.set()
            time.sleep(0.5)
    fsio.set_io_hook(slow_disk)
for n in range(2, 5):
    writer.checkpoint("runtime_state", {"n": n}, step=n)
if mode == "async":
    started.wait(10)
pid = os.fork()
if pid == 0:  # the child: tries to write, then waits for the parent to finish, then exits
    fsio.set_io_hook(None)
    try:
        writer.checkpoint("runtime_state", {"n": "child"}, step=99)
        writer.flush()
        print("child wrote", flush=True)
    except afk.AfkLocalError as exc:
        print("child refused", type(exc).__name__, flush=True)
    while not os.path.exists(done):
        time.sleep(0.01)
    sys.exit(0)  # interpreter exit: atexit hooks run in the child too
fsio.set_io_hook(None)
writer.finish("parent done")
writer.close()
open(done, "w").close()
_, status = os.waitpid(pid, 0)
print("child exit", os.waitstatus_to_exitcode(status), flush=True)
"""


@pytest.mark.parametrize("mode", ["sync", "async", "exit"])
def test_a_forked_child_never_writes_into_its_parents_run(tmp_path, mode):
    root, done = tmp_path / "s", tmp_path / "parent-done"
    child = proc.spawn(FORKING_OWNER, str(root), mode, str(done))
    try:
        out, err = child.communicate(timeout=30)  # the child must not hang at exit
    except subprocess.TimeoutExpired:
        child.kill()
        out, err = child.communicate()
        pytest.fail(f"the forked child hung at exit: {out} {err}")
    assert child.returncode == 0, err
    assert "child refused" in out and "child exit 0" in out, out + err
    reader = afk.Store(root).open("r")
    assert reader.meta.status is afk.RunStatus.COMPLETED
    history = reader.history()
    assert [c.payload.get("n") for c in history[:-1]] == [1, 2, 3, 4] or mode != "sync"
    assert "child" not in [c.payload.get("n") for c in history]
    assert history[-1].phase == "run_terminal"
    assert reader.latest() == history[-1]  # latest not rolled back
    assert reader.verify().ok, reader.verify().problems
