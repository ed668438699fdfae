"""A serving watcher learns of changes from filesystem events: a writer's record in
``runs.changes`` makes a sweep, with no timer due (real child processes, SIGKILL)."""

from __future__ import annotations

import json
import os
import queue
import signal
import threading
from pathlib import Path

from proc import REPO, SUPPORT, kill_after, spawn

from afk_local.storage.format.records import RunStatus
from afk_local.storage.store import Store
from afk_local.watcher.attempts import update_meta_unowned
from afk_local.watcher.watcher import Watcher, WatchEvent

ENV = {
    "PYTHONPATH": os.pathsep.join(
        p for p in (str(SUPPORT), str(REPO), os.environ.get("PYTHONPATH", "")) if p
    )
}
JOB_SCRIPT = """
import json, sys
import watcher_jobs
job = getattr(watcher_jobs, sys.argv[1]).with_store(sys.argv[2])
print(job.run(*json.loads(sys.argv[4]), run_id=sys.argv[3]), flush=True)
"""
NEVER = 3600.0
"""A timer sweep interval no test waits for."""


def _interrupted(root: Path, out: Path) -> None:
    """Run ``counter`` as ``r1`` and SIGKILL it after two items: an interrupted run."""
    job = spawn(JOB_SCRIPT, "counter", str(root), "r1", json.dumps([str(out), 4, 0.1]), env=ENV)
    killed = kill_after(job, acks=2, seconds=60)
    assert killed.returncode == -signal.SIGKILL, killed.stderr


def _next(events: queue.Queue[WatchEvent], kinds: set[str]) -> WatchEvent:
    while True:
        event = events.get(timeout=90)
        if event.kind in kinds:
            return event


def test_a_change_told_to_runs_changes_is_acted_on_without_a_timer_sweep(tmp_path: Path) -> None:
    root, out = tmp_path / "store", tmp_path / "out.txt"
    _interrupted(root, out)
    store = Store(root)
    # parked for now: the watcher's first sweep leaves it alone
    assert update_meta_unowned(store, "r1", lambda meta: {"status": RunStatus.PAUSED})
    events: queue.Queue[WatchEvent] = queue.Queue()
    watching = threading.Event()
    watcher = Watcher(Store(root), on_event=events.put, env=ENV, interval=NEVER, backoff=0.1)
    thread = threading.Thread(target=watcher.serve, kwargs={"on_tick": watching.set})
    thread.start()
    try:
        assert watching.wait(60)
        assert events.empty()
        # a change inside the run's directory: no event in runs/, one record in runs.changes
        assert update_meta_unowned(store, "r1", lambda meta: {"status": RunStatus.RUNNING})
        assert _next(events, {"resumed"}).run_id == "r1"
        done = _next(events, {"completed", "failed", "gave_up"})
        assert (done.kind, done.run_id) == ("completed", "r1")
    finally:
        watcher.stop()
        thread.join(60)
    assert Store(root).open("r1").resume_state().result == sum(range(4))
    items = sorted(int(line.split()[0]) for line in out.read_text().splitlines())
    assert items == list(range(4))  # each item's effect once, across the kill


def test_a_steady_sweep_finds_a_run_a_killed_resume_left_running(tmp_path: Path) -> None:
    root, out = tmp_path / "store", tmp_path / "out.txt"
    _interrupted(root, out)
    store = Store(root)
    assert update_meta_unowned(store, "r1", lambda meta: {"status": RunStatus.PAUSED})
    watcher = Watcher(Store(root), env=ENV, safety_period=10_000.0)
    assert watcher.sweep() == []  # the full sweep: r1 is parked
    # a real resume, killed: running, its lock free, told to runs.changes by its writer
    assert update_meta_unowned(store, "r1", lambda meta: {"status": RunStatus.RUNNING})
    job = spawn(JOB_SCRIPT, "counter", str(root), "r1", json.dumps([str(out), 4, 0.1]), env=ENV)
    killed = kill_after(job, acks=1, seconds=60)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert watcher.sweep(full=False) == ["r1"]
