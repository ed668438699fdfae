"""DurableAgent under SIGKILL: a pydantic-ai agent killed mid-run resumes without asking again.

Real child processes (tests/support/pydantic_ai_jobs.py), SIGKILLed at a line they
print: once between the first model response and the tool call it asked for, once
inside a tool call (its side effect done, its outcome not yet journaled). The run
is resumed by ``job.run`` with the same run id in a new process, then by
``afk-local resume``. The model's request log and the tool's effect file say what
happened across all the processes.

Each of these runs twice: with the agent inside an ``@afk.durable`` job (``job``),
and on its own (``standalone``: ``durable_agent.run_sync(prompt, run_id=...)``, the
run's entrypoint being the module-level ``DurableAgent``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip(
    "pydantic_ai", reason="pydantic-ai not installed: pip install 'afk_local[test-all]'"
)

import proc
from proc import SUPPORT, afk_local_cli

import afk_local as afk

START = """
import sys
import pydantic_ai_jobs
output = pydantic_ai_jobs.agent_job.run("record two items", run_id=sys.argv[1])
print("OUTPUT " + output, flush=True)
"""

START_STANDALONE = """
import sys
import pydantic_ai_jobs
pydantic_ai_jobs.set_step_hook(pydantic_ai_jobs._on_step)
result = pydantic_ai_jobs.durable_agent.run_sync("record two items", run_id=sys.argv[1])
print("OUTPUT " + result.output, flush=True)
"""

MODES = {"job": START, "standalone": START_STANDALONE}

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


def kill_at(env: dict[str, str], run_id: str, marker: str, start: str = START) -> list[str]:
    """Start the job; SIGKILL the child once it printed ``marker`` (it stalls there)."""
    return proc.kill_at_line(proc.spawn(start, run_id, env={**env, "PAI_STALL_AT": marker}), marker)


def model_requests(files: Path) -> list[int]:
    """What the model was asked, over every process: the message count of each request."""
    return [int(n) for n in (files / "model.log").read_text().split()]


def effects(files: Path) -> list[str]:
    return [line.split()[0] for line in (files / "effects.txt").read_text().splitlines()]


def stored_output(result: object) -> object:
    """The output in a run's stored result (a standalone run stores the AgentRunResult)."""
    return result["output"] if isinstance(result, dict) else result


def reference_output(root: Path, tmp_path: Path, start: str = START) -> str:
    """The uninterrupted run: what every resumed run must end with."""
    files = tmp_path / "reference"
    files.mkdir()
    done = proc.run(start, "reference", env=env_for(root, files))
    assert done.returncode == 0, done.stderr
    assert model_requests(files) == [1, 3, 5]
    assert effects(files) == ["a", "b"]
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("OUTPUT ")]
    return line.removeprefix("OUTPUT ")


@pytest.mark.parametrize("mode", MODES)
def test_killed_agent_resumes_without_asking_the_model_again(tmp_path: Path, mode: str) -> None:
    root, files = tmp_path / "store", tmp_path / "files"
    files.mkdir()
    env = env_for(root, files)
    start = MODES[mode]
    reference = reference_output(root, tmp_path, start)
    assert reference == EXPECTED_OUTPUT

    # 1. Killed after the first model response was journaled, before its tool call.
    kill_at(env, "agent", FIRST_TOOL, start)
    assert model_requests(files) == [1]
    assert not (files / "effects.txt").exists()

    # 2. job.run with the same run id in a new process: the first answer is replayed,
    #    tool a runs, the model is asked the second question, and the child is killed
    #    inside tool b, after its effect and before its outcome is journaled.
    lines = kill_at(env, "agent", "TOOL b", start)
    assert "TOOL a" in lines
    assert model_requests(files) == [1, 3]
    assert effects(files) == ["a", "b"]
    # show tells the conversation so far from the journal, the cut-short call in doubt
    shown = afk_local_cli(env, "--root", str(root), "show", "agent", "--json")
    talk = [(e["role"], e["text"]) for e in json.loads(shown.stdout)["conversation"]["entries"]]
    assert talk == [
        ("instructions", "Record a, then b."),
        ("user", "record two items"),
        ("tool_call", '{"item": "a"}'),
        ("tool_result", "a-ok"),
        ("tool_call", '{"item": "b"}'),
        ("tool_result", "(in doubt: a kill cut this call short; it may or may not have happened)"),
    ]

    # 3. afk-local resume: tool b is in doubt and idempotent, so it is called again with
    #    the same key (the service drops it); the model gets only the last question.
    done = afk_local_cli(env, "--root", str(root), "resume", "agent")
    assert done.returncode == 0, done.stderr
    assert model_requests(files) == [1, 3, 5]  # never asked twice for the same answer
    assert effects(files) == ["a", "b"]  # each effect ran once overall
    reader = afk.Store(root).open("agent")
    assert reader.meta.status == "completed"
    assert stored_output(reader.resume_state().result) == reference
    assert reader.verify().ok
    if mode == "standalone":  # a run of its own, named by the module-level DurableAgent
        assert reader.meta.entrypoint == "pydantic_ai_jobs:durable_agent"
        assert reader.meta.params == {"args": ["record two items"], "kwargs": {}}
        messages = reader.resume_state().result["messages"]
        assert [m["kind"] for m in messages] == ["request", "response"] * 3

    # 4. The same call again in a new process: the stored output, no model, no tool.
    again = proc.run(start, "agent", env=env)
    assert again.returncode == 0, again.stderr
    assert f"OUTPUT {reference}" in again.stdout.splitlines()
    assert model_requests(files) == [1, 3, 5]
    assert effects(files) == ["a", "b"]


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


@pytest.mark.parametrize("mode", MODES)
def test_the_watcher_finishes_an_agent_killed_inside_a_tool(tmp_path: Path, mode: str) -> None:
    root, files = tmp_path / "store", tmp_path / "files"
    files.mkdir()
    env = env_for(root, files)
    kill_at(env, "watched", "TOOL a", MODES[mode])  # tool a done, its outcome not journaled
    assert (model_requests(files), effects(files)) == ([1], ["a"])

    fast = ["--interval", "0.2", "--backoff", "0.2", "--grace", "10"]
    done = afk_local_cli(env, "--root", str(root), "watch", "--once", *fast)
    assert done.returncode == 0, done.stderr
    assert model_requests(files) == [1, 3, 5]
    assert effects(files) == ["a", "b"]
    reader = afk.Store(root).open("watched")
    assert reader.meta.status == "completed"
    assert stored_output(reader.resume_state().result) == EXPECTED_OUTPUT


ASK = """
import afk_local as afk
import pydantic_ai_jobs
try:
    pydantic_ai_jobs.approval_job.run(run_id="ship")
except afk.RunPaused as paused:
    print("PAUSED " + paused.kind, flush=True)
"""

ASK_STANDALONE = """
import afk_local as afk
import pydantic_ai_jobs
try:
    pydantic_ai_jobs.approval_durable_agent.run_sync("ship order 7", run_id="ship")
except afk.RunPaused as paused:
    print("PAUSED " + paused.kind, flush=True)
"""


@pytest.mark.parametrize("mode", MODES)
def test_an_approval_pause_answered_from_another_process_continues_the_agent(
    tmp_path: Path, mode: str
) -> None:
    root, files = tmp_path / "store", tmp_path / "files"
    files.mkdir()
    env = env_for(root, files)
    asked = proc.run(ASK if mode == "job" else ASK_STANDALONE, env=env)
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
    assert stored_output(reader.resume_state().result) == "shipping: order 7 shipped"
    assert (files / "effects.txt").read_text() == "ship 7\n"
    assert model_requests(files) == [1, 3]  # the first answer was replayed, not asked again
