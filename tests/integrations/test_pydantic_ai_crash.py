"""DurableAgent under SIGKILL: a pydantic-ai agent killed mid-run resumes without asking again.

Real child processes (tests/support/pydantic_ai_jobs.py), SIGKILLed at a line they
print: once between the first model response and the tool call it asked for, once
inside a tool call (its side effect done, its outcome not yet journaled). The run
is resumed by ``job.run`` with the same run id in a new process, then by
``afk-local resume``. The model's request log and the tool's effect file say what
happened across all the processes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip(
    "pydantic_ai", reason="pydantic-ai not installed: pip install 'afk_local[test]'"
)

import proc
from proc import SUPPORT

import afk_local as afk

START = """
import sys
import pydantic_ai_jobs
output = pydantic_ai_jobs.agent_job.run("record two items", run_id=sys.argv[1])
print("OUTPUT " + output, flush=True)
"""

FIRST_TOOL = "STEP pydantic-ai.tool.record.call-a#1"
EXPECTED_OUTPUT = "recorded a-ok, b-ok"


def env_for(root: Path, files: Path, **extra: str) -> dict[str, str]:
    return {
        "PYTHONPATH": os.pathsep.join([str(SUPPORT), os.environ.get("PYTHONPATH", "")]),
        "AFK_LOCAL_ROOT": str(root),
        "PAI_MODEL_LOG": str(files / "model.log"),
        "PAI_EFFECTS": str(files / "effects.txt"),
        **extra,
    }


def kill_at(env: dict[str, str], run_id: str, marker: str) -> list[str]:
    """Start the job; SIGKILL the child once it printed ``marker`` (it stalls there)."""
    child = proc.spawn(START, run_id, env={**env, "PAI_STALL_AT": marker})
    watchdog = threading.Timer(120, child.kill)
    watchdog.start()
    lines: list[str] = []
    try:
        assert child.stdout is not None
        for line in child.stdout:
            lines.append(line.rstrip("\n"))
            if lines[-1] == marker:
                child.send_signal(signal.SIGKILL)
                break
    finally:
        watchdog.cancel()
    child.wait()
    stderr = child.stderr.read() if child.stderr else ""
    assert child.returncode == -signal.SIGKILL, f"{lines}\n{stderr}"
    return lines


def model_requests(files: Path) -> list[int]:
    """What the model was asked, over every process: the message count of each request."""
    return [int(n) for n in (files / "model.log").read_text().split()]


def effects(files: Path) -> list[str]:
    return [line.split()[0] for line in (files / "effects.txt").read_text().splitlines()]


def afk_local_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "afk_local", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def reference_output(root: Path, tmp_path: Path) -> str:
    """The uninterrupted run: what every resumed run must end with."""
    files = tmp_path / "reference"
    files.mkdir()
    done = proc.run(START, "reference", env=env_for(root, files))
    assert done.returncode == 0, done.stderr
    assert model_requests(files) == [1, 3, 5]
    assert effects(files) == ["a", "b"]
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("OUTPUT ")]
    return line.removeprefix("OUTPUT ")


def test_killed_agent_resumes_without_asking_the_model_again(tmp_path: Path) -> None:
    root, files = tmp_path / "store", tmp_path / "files"
    files.mkdir()
    env = env_for(root, files)
    reference = reference_output(root, tmp_path)
    assert reference == EXPECTED_OUTPUT

    # 1. Killed after the first model response was journaled, before its tool call.
    kill_at(env, "agent", FIRST_TOOL)
    assert model_requests(files) == [1]
    assert not (files / "effects.txt").exists()

    # 2. job.run with the same run id in a new process: the first answer is replayed,
    #    tool a runs, the model is asked the second question, and the child is killed
    #    inside tool b, after its effect and before its outcome is journaled.
    lines = kill_at(env, "agent", "TOOL b")
    assert "TOOL a" in lines
    assert model_requests(files) == [1, 3]
    assert effects(files) == ["a", "b"]

    # 3. afk-local resume: tool b is in doubt and idempotent, so it is called again with
    #    the same key (the service drops it); the model gets only the last question.
    done = afk_local_cli(env, "--root", str(root), "resume", "agent")
    assert done.returncode == 0, done.stderr
    assert model_requests(files) == [1, 3, 5]  # never asked twice for the same answer
    assert effects(files) == ["a", "b"]  # each effect ran once overall
    reader = afk.Store(root).open("agent")
    assert reader.meta.status == "completed"
    assert reader.resume_state().result == reference
    assert reader.verify().ok


def test_a_plain_tool_killed_mid_call_is_reported_in_doubt(tmp_path: Path) -> None:
    root, files = tmp_path / "store", tmp_path / "files"
    files.mkdir()
    env = env_for(root, files, PAI_PLAIN_TOOL="1")
    kill_at(env, "plain", "TOOL a")
    assert effects(files) == ["a"]

    done = afk_local_cli(env, "--root", str(root), "resume", "plain")
    assert done.returncode == 1
    assert "pydantic-ai.tool.record.call-a#1" in done.stderr
    assert "may or may not have happened" in done.stderr
    assert effects(files) == ["a"]  # not called again behind the user's back
    assert model_requests(files) == [1]


def test_the_watcher_finishes_an_agent_killed_inside_a_tool(tmp_path: Path) -> None:
    root, files = tmp_path / "store", tmp_path / "files"
    files.mkdir()
    env = env_for(root, files)
    kill_at(env, "watched", "TOOL a")  # tool a's effect done, its outcome not journaled
    assert (model_requests(files), effects(files)) == ([1], ["a"])

    fast = ["--interval", "0.2", "--backoff", "0.2", "--grace", "10"]
    done = afk_local_cli(env, "--root", str(root), "watch", "--once", *fast)
    assert done.returncode == 0, done.stderr
    assert model_requests(files) == [1, 3, 5]
    assert effects(files) == ["a", "b"]
    reader = afk.Store(root).open("watched")
    assert reader.meta.status == "completed"
    assert reader.resume_state().result == EXPECTED_OUTPUT


ASK = """
import afk_local as afk
import pydantic_ai_jobs
try:
    pydantic_ai_jobs.approval_job.run(run_id="ship")
except afk.RunPaused as paused:
    print("PAUSED " + paused.kind, flush=True)
"""


def test_an_approval_pause_answered_from_another_process_continues_the_agent(
    tmp_path: Path,
) -> None:
    root, files = tmp_path / "store", tmp_path / "files"
    files.mkdir()
    env = env_for(root, files)
    asked = proc.run(ASK, env=env)
    assert asked.returncode == 0, asked.stderr
    assert "PAUSED approval" in asked.stdout
    reader = afk.Store(root).open("ship")
    assert reader.meta.status == "paused"
    assert model_requests(files) == [1]
    assert not (files / "effects.txt").exists()  # nothing shipped before the answer

    # an answer that does not fit is not taken for a yes: the run asks again, saying why
    wrong = afk_local_cli(env, "--root", str(root), "resume", "ship", "--input", '{"x": true}')
    assert afk.Store(root).open("ship").meta.status == "paused", wrong.stderr
    assert not (files / "effects.txt").exists()

    done = afk_local_cli(env, "--root", str(root), "resume", "ship", "--input", '{"ship-7": true}')
    assert done.returncode == 0, done.stderr
    reader = afk.Store(root).open("ship")
    assert reader.meta.status == "completed"
    assert reader.resume_state().result == "shipping: order 7 shipped"
    assert (files / "effects.txt").read_text() == "ship 7\n"
    assert model_requests(files) == [1, 3]  # the first answer was replayed, not asked again
