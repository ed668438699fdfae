"""Ctrl-C and kills in the middle of a step, with real processes.

- The first Ctrl-C (SIGINT) lets the running step finish, checkpoints and exits 130
  with one line; the resume runs every effect exactly once.
- A second Ctrl-C stops at once (that step may be left in doubt).
- A step whose function takes ``idempotency_key``, SIGKILLed mid-call, is called
  again with the same key on resume, without a settle.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import proc
import pytest

import afk_local as afk

JOB = """
import asyncio, os, sys, time
import afk_local as afk

STEP_S = float(os.environ.get("STEP_S", "0"))

def record(path, item):
    print("in-step", item, flush=True)
    time.sleep(STEP_S)
    with open(path, "a") as fh:
        fh.write(f"{item}\\n")
    return item

def send(path, item, *, idempotency_key):
    # an outside service that deduplicates by key: it logs every call it receives
    with open(path, "a") as fh:
        fh.write(f"{item} {idempotency_key}\\n")
    print("sent", item, flush=True)
    time.sleep(STEP_S)
    return item

@afk.durable(store=sys.argv[1])
def sync_job(ctx, path, n, keyed):
    for item in ctx.iterate(range(n), progress=False):
        if keyed:
            ctx.step("send", send, path, item)
        else:
            ctx.step("record", record, path, item)
    return n

@afk.durable(store=sys.argv[1])
async def async_job(ctx, path, n, keyed):
    for item in ctx.iterate(range(n), progress=False):
        if keyed:
            await ctx.astep("send", send, path, item)
        else:
            await ctx.astep("record", record, path, item)
        if os.environ.get("WAIT_S"):
            print("waiting", item, flush=True)
            await asyncio.sleep(float(os.environ["WAIT_S"]))
    return n

job = async_job if os.environ.get("ASYNC_JOB") == "1" else sync_job

print("result", job.run(sys.argv[2], int(sys.argv[3]), sys.argv[4] == "keyed", run_id="r"))
"""
N = 5


def start(root: Path, outside: Path, *, step_s: float, keyed: bool = False, is_async: bool = False):
    mode = "keyed" if keyed else "plain"
    env = {"STEP_S": str(step_s), "ASYNC_JOB": "1" if is_async else "0"}
    return proc.spawn(JOB, str(root), str(outside), str(N), mode, env=env)


def wait_for(child: subprocess.Popen[str], line: str) -> None:
    assert child.stdout is not None
    while True:
        got = child.stdout.readline()
        assert got, f"child ended before {line!r}: {child.stderr.read() if child.stderr else ''}"
        if got.strip() == line:
            return


def finish(
    root: Path, outside: Path, *, keyed: bool = False, is_async: bool = False
) -> subprocess.CompletedProcess[str]:
    mode = "keyed" if keyed else "plain"
    env = {"STEP_S": "0", "ASYNC_JOB": "1" if is_async else "0"}
    return proc.run(JOB, str(root), str(outside), str(N), mode, env=env)


def lines(path: Path) -> list[str]:
    return [line for line in path.read_text().split("\n") if line]


@pytest.mark.parametrize("is_async", [False, True], ids=["def", "async-def"])
def test_first_ctrl_c_finishes_the_step_checkpoints_and_exits_130_with_one_line(
    tmp_path: Path, is_async: bool
) -> None:
    root, outside = tmp_path / "store", tmp_path / "outside.txt"
    child = start(root, outside, step_s=0.8, is_async=is_async)
    wait_for(child, "in-step 2")
    child.send_signal(signal.SIGINT)  # while step 2 runs
    out, err = child.communicate(timeout=60)
    assert child.returncode == 130, err
    assert err.splitlines() == [
        "run r stopped by Ctrl-C, after its running step finished and was checkpointed; "
        "continue it with `afk-local resume r`"
    ]
    assert "result" not in out
    store = afk.Store(root)
    reader = store.open("r")
    assert store.read_meta("r").status is afk.RunStatus.RUNNING  # stopped, not failed
    assert not store.owner_alive("r")
    effects = reader.effects()
    assert [e.key for e in effects if e.kind == "outcome"] == [
        f"iterate#1[{i}]/record#1" for i in range(3)
    ]  # the step that was running when Ctrl-C came recorded its outcome: nothing in doubt
    assert lines(outside) == ["0", "1", "2"]

    done = finish(root, outside, is_async=is_async)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith(f"result {N}")
    assert lines(outside) == [str(i) for i in range(N)]  # every effect exactly once


def test_a_ctrl_c_between_steps_of_an_async_job_stops_it_with_one_line(tmp_path: Path) -> None:
    """No step in flight (the job awaits the loop): Ctrl-C cancels the job's task, which
    stops as it asked, exit 130 and the one line; the resume runs the rest once."""
    root, outside = tmp_path / "store", tmp_path / "outside.txt"
    child = proc.spawn(
        JOB, str(root), str(outside), str(N), "plain",
        env={"STEP_S": "0", "ASYNC_JOB": "1", "WAIT_S": "30"},
    )  # fmt: skip
    wait_for(child, "waiting 0")
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=20)  # not the 30 s wait
    assert child.returncode == 130, err
    assert "Traceback" not in err
    assert err.splitlines() == [
        "run r stopped by Ctrl-C, after its running step finished and was checkpointed; "
        "continue it with `afk-local resume r`"
    ]
    assert lines(outside) == ["0"]
    done = finish(root, outside, is_async=True)
    assert done.returncode == 0, done.stderr
    assert lines(outside) == [str(i) for i in range(N)]


def test_a_second_ctrl_c_stops_at_once(tmp_path: Path) -> None:
    root, outside = tmp_path / "store", tmp_path / "outside.txt"
    child = start(root, outside, step_s=30)
    wait_for(child, "in-step 0")
    child.send_signal(signal.SIGINT)
    time.sleep(0.3)
    started = time.monotonic()
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=20)
    assert time.monotonic() - started < 15  # did not wait for the 30 s step
    assert child.returncode == 130, err
    assert "Traceback" not in err
    assert err.splitlines() == [
        "run r stopped at once by a second Ctrl-C: the step that was running may be in "
        "doubt; continue it with `afk-local resume r`"
    ]
    effects = afk.Store(root).open("r").effects()
    assert [(e.key, e.kind) for e in effects] == [("iterate#1[0]/record#1", "intent")]


def test_a_keyed_step_killed_mid_call_is_retried_with_the_same_key_without_a_settle(
    tmp_path: Path,
) -> None:
    root, service = tmp_path / "store", tmp_path / "service.log"
    child = start(root, service, step_s=5, keyed=True)
    wait_for(child, "sent 2")  # the service has the call; its outcome is not journaled
    child.kill()
    child.communicate(timeout=30)
    assert child.returncode == -signal.SIGKILL
    reader = afk.Store(root).open("r")
    in_doubt = reader.effects()[-1]
    assert in_doubt.kind == "intent"

    done = finish(root, service, keyed=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith(f"result {N}")
    calls = [line.split() for line in lines(service)]
    assert [item for item, _ in calls] == ["0", "1", "2", "2", "3", "4"]
    keys = {item: {key for i, key in calls if i == item} for item, _ in calls}
    assert all(len(k) == 1 for k in keys.values())  # the retry carried the same key
    assert keys["2"] == {in_doubt.idempotency_key}
    assert "in doubt" in done.stderr  # said, as a warning: it was called again
