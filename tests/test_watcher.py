"""The watcher with real processes: SIGKILLed jobs resume by themselves, exactly once.

Jobs live in ``tests/watcher_jobs.py`` (on PYTHONPATH for every child). Each
test kills real children with SIGKILL or SIGTERM and checks the outcome, never
timings.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

from afk_local.records import RunStatus
from afk_local.store import Store
from tests.proc import kill_after, spawn

TESTS = Path(__file__).parent
REPO = TESTS.parent
ENV = {
    "PYTHONPATH": os.pathsep.join(
        p for p in (str(TESTS), str(REPO), os.environ.get("PYTHONPATH", "")) if p
    )
}
FAST = ["--interval", "0.2", "--backoff", "0.2", "--grace", "10"]

JOB_SCRIPT = """
import json, sys
import watcher_jobs
job = getattr(watcher_jobs, sys.argv[1]).with_store(sys.argv[2])
print(job.run(*json.loads(sys.argv[4]), run_id=sys.argv[3]), flush=True)
"""


def start_job(root: Path, job: str, run_id: str, *args: object) -> subprocess.Popen[str]:
    """A child process running ``watcher_jobs.<job>(*args)`` as run ``run_id``."""
    return spawn(JOB_SCRIPT, job, str(root), run_id, json.dumps(list(args)), env=ENV)


def interrupt(root: Path, job: str, run_id: str, *args: object, acks: int) -> None:
    """Start a job and SIGKILL it after ``acks`` lines: an interrupted run."""
    killed = kill_after(start_job(root, job, run_id, *args), acks=acks, seconds=60)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert len(killed.lines) >= acks, killed.stderr


def watch_cmd(root: Path, *flags: str) -> list[str]:
    return [sys.executable, "-m", "afk_local", "watch", "--root", str(root), "--json", *flags]


def watch_once(root: Path, *flags: str, timeout: float = 90) -> tuple[int, list[dict]]:
    """``afk-local watch --once --json``: exit code and events."""
    env = {**os.environ, **ENV}
    res = subprocess.run(
        watch_cmd(root, "--once", *FAST, *flags),
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    events = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    assert not res.stderr.strip() or "Traceback" not in res.stderr, res.stderr
    return res.returncode, events


def effects_once(out: Path, n: int) -> None:
    """The outside side effect ran exactly once per item."""
    items = sorted(int(line.split()[0]) for line in out.read_text().splitlines())
    assert items == list(range(n))


def of(events: list[dict], kind: str, run_id: str | None = None) -> list[dict]:
    return [e for e in events if e["event"] == kind and (run_id is None or e["run_id"] == run_id)]


# -- 1. a SIGKILLed job is resumed to completion by `watch --once` ------------------------


def test_killed_job_resumed_to_completion_by_watch_once(tmp_path: Path) -> None:
    root, out = tmp_path / "store", tmp_path / "out.txt"
    interrupt(root, "counter", "r1", str(out), 6, 0.2, acks=3)
    store = Store(root)
    assert store.read_meta("r1").status is RunStatus.RUNNING
    assert store.interrupted() == ["r1"]

    code, events = watch_once(root)

    assert code == 0, events
    assert [e["run_id"] for e in of(events, "resumed")] == ["r1"]
    assert [e["run_id"] for e in of(events, "completed")] == ["r1"]
    assert store.read_meta("r1").status is RunStatus.COMPLETED
    assert store.open("r1").resume_state().result == sum(range(6))
    effects_once(out, 6)
    log = Path(of(events, "resumed")[0]["log"])
    assert log.parent == store.paths("r1").dir / "logs"
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    assert stat.S_IMODE(log.parent.stat().st_mode) == 0o700
    assert "completed" in log.read_text()
    # nothing left to do: a second sweep resumes nothing
    code, events = watch_once(root)
    assert code == 0 and not of(events, "resumed")
