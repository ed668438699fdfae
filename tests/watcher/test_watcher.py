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
from typing import Any

import msgspec
from proc import REPO, SUPPORT, JsonLinesChild, kill_after, python, spawn

from afk_local.storage import fsio
from afk_local.storage.format import codec
from afk_local.storage.format.records import OwnerInfo, RunStatus
from afk_local.storage.rundir.ownership import acquire_lock
from afk_local.storage.store import Store
from afk_local.watcher.watcher import Watcher, WatchEvent

TESTS = SUPPORT
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


# -- helpers for a serving watcher ---------------------------------------------------------


def Serving(root: Path, *flags: str) -> JsonLinesChild:
    """``afk-local watch --json`` running in the background; its events collected."""
    return JsonLinesChild(watch_cmd(root, *FAST, *flags), {**os.environ, **ENV})


def status(store: Store, run_id: str) -> RunStatus:
    return store.read_meta(run_id).status


def rewrite_meta(store: Store, run_id: str, *, locked: bool = True, **changes: object) -> None:
    """Edit run.meta as a previous boot would have left it (under the lock when ``locked``)."""
    paths = store.paths(run_id)
    lock = acquire_lock(paths, 0) if locked else None
    try:
        meta = msgspec.structs.replace(store.read_meta(run_id), **changes)
        fsio.atomic_write(paths.meta, codec.encode_meta(store.codec, meta))
    finally:
        if lock is not None:
            lock.release()


# -- 2. "reboot": runs of an earlier boot are resumed, a live owner is never touched --------


def test_reboot_resumes_runs_of_an_earlier_boot_and_never_touches_a_live_owner(
    tmp_path: Path,
) -> None:
    root, out, gate = tmp_path / "store", tmp_path / "out.txt", tmp_path / "gate"
    store = Store(root)
    old_boot = OwnerInfo(pid=999_999, hostname="laptop", boot_id="0" * 32, process_start=1)
    for rid in ("boot-a", "boot-b"):
        interrupt(root, "counter", rid, str(tmp_path / f"{rid}.txt"), 3, 0.2, acks=2)
        rewrite_meta(store, rid, owner=old_boot)
    live = start_job(root, "gated", "live", str(out), str(gate))
    try:
        assert live.stdout is not None
        assert live.stdout.readline().strip() == "waiting"
        # stale-looking meta: an old boot, a dead pid; but the lock is held by a live process
        rewrite_meta(store, "live", locked=False, owner=old_boot)
        before = store.paths("live").meta.read_bytes()

        code, events = watch_once(root)

        assert code == 0, events
        assert sorted(e["run_id"] for e in of(events, "resumed")) == ["boot-a", "boot-b"]
        assert sorted(e["run_id"] for e in of(events, "completed")) == ["boot-a", "boot-b"]
        for rid in ("boot-a", "boot-b"):
            assert status(store, rid) is RunStatus.COMPLETED
            effects_once(tmp_path / f"{rid}.txt", 3)
        assert not any(e["run_id"] == "live" for e in events)
        assert store.paths("live").meta.read_bytes() == before
        assert not (store.paths("live").dir / "logs").exists()
        gate.touch()
        assert live.wait(timeout=30) == 0
    finally:
        if live.poll() is None:
            live.kill()
            live.wait()
    assert status(store, "live") is RunStatus.COMPLETED


# -- 3. two watchers at once: each run resumed exactly once --------------------------------


def test_two_watchers_resume_each_run_exactly_once(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = Store(root)
    rids = ["two-a", "two-b", "two-c"]
    for rid in rids:
        interrupt(root, "counter", rid, str(tmp_path / f"{rid}.txt"), 3, 0.1, acks=1)
    env = {**os.environ, **ENV}
    procs = [
        subprocess.Popen(
            watch_cmd(root, "--once", *FAST), stdout=subprocess.PIPE, text=True, env=env
        )
        for _ in range(2)
    ]
    events = []
    for proc in procs:
        stdout, _ = proc.communicate(timeout=90)
        assert proc.returncode == 0, stdout
        events += [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    for rid in rids:
        assert len(of(events, "resumed", rid)) == 1, events
        assert len(of(events, "completed", rid)) == 1, events
        assert status(store, rid) is RunStatus.COMPLETED
        effects_once(tmp_path / f"{rid}.txt", 3)
        assert store.read_meta(rid).attempt == 2  # the first process, then exactly one resume


# -- 4. a crash loop stops after max_attempts, with growing backoff ------------------------


def test_crash_loop_is_failed_after_max_attempts_with_growing_backoff(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = Store(root)
    killed = kill_after(start_job(root, "crasher", "loop"), seconds=60)
    assert killed.returncode == -signal.SIGKILL
    with Serving(root, "--max-attempts", "3") as watcher:
        watcher.wait_for(lambda: status(store, "loop") is RunStatus.FAILED)
        watcher.wait_for(lambda: of(watcher.events, "gave_up", "loop"))
        assert watcher.stop() == 0
    events = watcher.events
    assert len(of(events, "resumed", "loop")) == 3
    delays = [e["delay_s"] for e in of(events, "backoff", "loop")]
    assert len(delays) == 2
    assert delays[0] < delays[1]
    meta = store.read_meta("loop")
    assert meta.status is RunStatus.FAILED
    assert meta.error is not None
    assert "gave up after 3" in meta.error.message
    assert "SIGKILL" in meta.error.message
    assert store.open("loop").latest().phase == "run_terminal"
    # left alone afterwards: another watcher does not touch it
    code, again = watch_once(root)
    assert code == 0 and not of(again, "resumed")


# -- 5. a run killed while the watcher runs is resumed by the timer sweep ------------------


def test_run_killed_under_a_running_watcher_is_resumed_without_fs_events(tmp_path: Path) -> None:
    root, out = tmp_path / "store", tmp_path / "out.txt"
    store = Store(root)
    fsio.make_dirs(root / "runs")
    with Serving(root) as watcher:
        # the run's directory appears (an event) while its owner is alive; its death
        # makes no event at all: only the timer sweep can notice it
        interrupt(root, "counter", "late", str(out), 4, 0.2, acks=2)
        watcher.wait_for(lambda: status(store, "late") is RunStatus.COMPLETED)
        watcher.wait_for(lambda: of(watcher.events, "completed", "late"))
        assert watcher.stop() == 0
    assert len(of(watcher.events, "resumed", "late")) == 1
    effects_once(out, 4)
    assert store.open("late").resume_state().result == sum(range(4))


# -- 6. SIGTERM to the watcher: children checkpoint and stop, the next watcher finishes ----


def test_sigterm_stops_children_cleanly_and_next_watcher_finishes(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = Store(root)
    rids = ["term-a", "term-b"]
    for rid in rids:
        # time is spent inside non-idempotent steps: SIGTERM must wait for the outcome,
        # or the next resume finds the step in doubt and refuses. (Created, never run:
        # what `afk-local submit` leaves for the watcher.)
        args = [str(tmp_path / f"{rid}.txt"), 12, 0.3]
        store.create(
            rid, entrypoint="watcher_jobs:slow_counter", params={"args": args, "kwargs": {}}
        ).close()
    with Serving(root) as watcher:
        watcher.wait_for(lambda: len(of(watcher.events, "resumed")) == 2)
        for rid in rids:  # each child has made progress of its own
            path = tmp_path / f"{rid}.txt"
            watcher.wait_for(lambda p=path: p.exists() and len(p.read_text().splitlines()) >= 2)
        assert watcher.stop() == 0
    stopped = of(watcher.events, "stopped")
    assert sorted(e["run_id"] for e in stopped) == rids
    # they exited by themselves within the grace period, not by the SIGKILL after it
    assert all(e["exit_code"] != -signal.SIGKILL for e in stopped), stopped
    assert not of(watcher.events, "failed") and not of(watcher.events, "backoff")
    for rid in rids:
        meta = store.read_meta(rid)
        assert meta.status is RunStatus.RUNNING, meta  # stopped, not failed
        assert meta.watcher_attempts == 0 and meta.next_attempt_ms == 0
        assert not store.owner_alive(rid)

    code, events = watch_once(root)
    assert code == 0, events
    for rid in rids:
        assert status(store, rid) is RunStatus.COMPLETED
        assert store.open(rid).resume_state().result == sum(range(12))
        effects_once(tmp_path / f"{rid}.txt", 12)


# -- 7. requests: malformed ones are rejected, the watcher keeps serving -------------------


def afk(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return python(
        ["-m", "afk_local", *args, "--root", str(root)], env={**os.environ, **ENV}, timeout=60
    )


def test_malformed_requests_are_rejected_and_the_watcher_keeps_serving(tmp_path: Path) -> None:
    root, out, flag = tmp_path / "store", tmp_path / "out.txt", tmp_path / "flag"
    store = Store(root)
    # a run that failed (the job raised): never auto-resumed, but a person may ask
    args = json.dumps([str(out), str(flag)])
    res = subprocess.run(
        [sys.executable, "-c", JOB_SCRIPT, "flaky", str(root), "flaky", args],
        capture_output=True,
        text=True,
        env={**os.environ, **ENV},
        timeout=60,
    )
    assert res.returncode != 0 and status(store, "flaky") is RunStatus.FAILED
    with Serving(root) as watcher:
        fsio.make_dirs(store.requests_dir)
        (store.requests_dir / "garbage.json").write_bytes(b"\x00not json at all")
        fsio.atomic_write(store.requests_dir / "odd.json", b'{"kind": "explode", "run_id": "x"}')
        fsio.atomic_write(
            store.requests_dir / "sneaky.json", b'{"kind": "resume", "run_id": "../x"}'
        )
        watcher.wait_for(lambda: len(of(watcher.events, "rejected")) == 3)
        rejected = store.requests_dir / "rejected"
        for name in ("garbage.json", "odd.json", "sneaky.json"):
            assert (rejected / name).exists()
            assert (rejected / f"{name}.reason").read_text().strip()
        assert "explode" in (rejected / "odd.json.reason").read_text()

        # still serving: a submitted job runs, and a failed run resumes on request
        sub = afk(
            root,
            "submit",
            "watcher_jobs:counter",
            json.dumps([str(tmp_path / "s.txt"), 3, 0.05]),
            "--run-id",
            "sub",
        )
        assert sub.returncode == 0, sub.stderr
        watcher.wait_for(lambda: of(watcher.events, "completed", "sub"))
        assert store.open("sub").resume_state().result == 3
        assert not of(watcher.events, "resumed", "flaky")  # failed: left alone by sweeps
        req = afk(root, "resume", "flaky", "--via-watcher")
        assert req.returncode == 0, req.stderr
        watcher.wait_for(lambda: of(watcher.events, "completed", "flaky"))
        assert watcher.stop() == 0
    assert store.open("flaky").resume_state().result == "fine"
    assert not [p for p in store.requests_dir.iterdir() if p.is_file()]


# -- 8. a planted owner.lock is damage: reported, and the watcher goes on ------------------


def test_planted_owner_lock_is_reported_and_the_watcher_goes_on(tmp_path: Path) -> None:
    """A symlink or a FIFO in place of owner.lock never freezes a run as live nor the watcher."""
    root = tmp_path / "store"
    for run_id in ("ok", "symlinked", "fifo"):
        interrupt(root, "counter", run_id, str(tmp_path / f"{run_id}.txt"), 4, 0.05, acks=2)
    store = Store(root)
    (tmp_path / "elsewhere").write_text("")
    store.paths("symlinked").lock.unlink()
    store.paths("symlinked").lock.symlink_to(tmp_path / "elsewhere")
    store.paths("fifo").lock.unlink()
    os.mkfifo(store.paths("fifo").lock)

    code, events = watch_once(root, timeout=60)

    assert of(events, "completed", "ok"), events
    effects_once(tmp_path / "ok.txt", 4)
    for run_id in ("symlinked", "fifo"):
        (damaged,) = of(events, "damaged", run_id)
        assert "owner.lock" in damaged["message"], damaged
        assert not of(events, "resumed", run_id), events
        assert status(store, run_id) is RunStatus.RUNNING  # left for a person to repair
    assert code == 1  # damage is a problem found


# -- one definition of "interrupted": the watcher, Store and the listing agree ------------


def test_watcher_store_and_listing_agree_on_which_runs_are_interrupted(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    cases = {
        "crashed": RunStatus.RUNNING,
        "never-started": RunStatus.CREATED,
        "paused": RunStatus.PAUSED,
        "failed": RunStatus.FAILED,
        "done": RunStatus.COMPLETED,
        "live": RunStatus.RUNNING,
        "fifo": RunStatus.RUNNING,
    }
    for run_id, run_status in cases.items():
        store.create(run_id).close()
        rewrite_meta(store, run_id, status=run_status, entrypoint="watcher_jobs:counter")
    store.paths("fifo").lock.unlink(missing_ok=True)
    os.mkfifo(store.paths("fifo").lock)
    live = acquire_lock(store.paths("live"), 0)
    try:
        by_watcher = sorted(Watcher(store, on_event=lambda _e: None).interrupted())
        by_store = sorted(store.interrupted())
        by_listing = sorted(i.run_id for i in store.runs() if i.interrupted)
        filtered = sorted(i.run_id for i in store.runs(status="interrupted"))
    finally:
        live.release()
    assert by_watcher == by_store == by_listing == filtered == ["crashed", "never-started"]


# -- a keyed store under the Python watcher -------------------------------------------------


def test_python_watcher_of_a_keyed_store_gives_its_children_the_key(tmp_path: Path) -> None:
    """``Watcher(Store(root, key=K))`` with no key in the environment resumes a keyed run.

    The key reaches the child through its environment only: not on its command line.
    """
    key = "the-watchers-own-key"
    root = tmp_path / "store"
    out = tmp_path / "out.txt"
    job = spawn(JOB_SCRIPT, "counter", str(root), "keyed", json.dumps([str(out), 6, 0.1]),
                env={**ENV, "AFK_LOCAL_KEY": key})  # fmt: skip
    killed = kill_after(job, acks=3, seconds=60)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert "AFK_LOCAL_KEY" not in os.environ  # the watcher's key comes from Store(key=...)
    events: list[WatchEvent] = []
    commands: list[list[str]] = []
    watcher = Watcher(
        Store(root, key=key), on_event=events.append, env=ENV, backoff=0.1, max_attempts=2
    )
    child_command = watcher.child_command

    def recorded(*args: Any, **kwargs: Any) -> list[str]:
        command = child_command(*args, **kwargs)
        commands.append(command)
        return command

    watcher.child_command = recorded  # type: ignore[method-assign]

    assert watcher.run_once() == 0, [(e.kind, e.message) for e in events]

    assert [(e.kind, e.run_id) for e in events] == [("resumed", "keyed"), ("completed", "keyed")]
    store = Store(root, key=key)
    assert store.open("keyed").resume_state().result == sum(range(6))
    assert store.open("keyed").verify().ok
    effects_once(out, 6)
    assert commands and all(key not in " ".join(command) for command in commands)
