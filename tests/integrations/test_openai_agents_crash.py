"""DurableRunner under SIGKILL: an Agents SDK agent killed mid-run resumes without asking again.

Real child processes (tests/support/openai_agents_jobs.py), SIGKILLed at a line they
print: between the first model response and the tool call it asked for, inside a tool
call (its side effect done, its outcome not yet journaled), after a handoff; the agent
job calls ``DurableRunner`` in the drop-in form (no ctx), and a standalone run (no job at
all, ``run_id=``) is killed and continued the same way. The run is
resumed by ``afk-local resume`` (itself killed once) and by the watcher (``afk-local
watch --once``). The model's request log and the tool's effect file say what happened
across all the processes; the output an uninterrupted run ends with
(``EXPECTED_OUTPUT``) is checked in test_openai_agents.py. Approvals from another
process: test_openai_agents_pause.py; sessions: test_openai_agents_session.py. Each
child imports the SDK (about 2 s of CPU), so the file keeps to eleven children.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip(
    "agents", reason="openai-agents not installed: pip install 'afk_local[test-all]'"
)

from openai_agents_procs import (
    EXPECTED_OUTPUT,
    FAST_WATCH,
    effects,
    env_for,
    kill_at,
    model_requests,
)
from proc import afk_local_cli

import afk_local as afk

FIRST_TOOL = "STEP openai-agents.tool.record.call-a#1"


CLI_RESUME = """
import runpy, sys
sys.argv = ["afk-local", "--root", sys.argv[1], "resume", sys.argv[2]]
runpy.run_module("afk_local", run_name="__main__")
"""

RECORDER_REQUESTS = ["recorder 1", "recorder 3", "recorder 5"]


def test_killed_agent_resumes_without_asking_the_model_again(tmp_path: Path) -> None:
    root, files = tmp_path / "store", tmp_path / "files"
    files.mkdir()
    env = env_for(root, files)

    # 1. Killed after the first model response was journaled, before its tool call.
    kill_at(env, FIRST_TOOL, "agent")
    assert model_requests(files) == ["recorder 1"]
    assert not (files / "effects.txt").exists()

    # 2. afk-local resume in a new process: the first answer is replayed, tool a runs,
    #    the model is asked the second question, and the child is killed inside tool b,
    #    after its effect and before its outcome is journaled.
    lines = kill_at(env, "TOOL b", str(root), "agent", script=CLI_RESUME)
    assert "TOOL a" in lines
    assert model_requests(files) == ["recorder 1", "recorder 3"]
    assert effects(files) == ["a", "b"]

    # 3. The watcher: tool b is in doubt and idempotent, so it is called again with the
    #    same key (the service drops it); the model gets only the last question.
    done = afk_local_cli(env, "--root", str(root), "watch", "--once", *FAST_WATCH)
    assert done.returncode == 0, done.stderr
    assert model_requests(files) == RECORDER_REQUESTS  # never asked twice for one answer
    assert effects(files) == ["a", "b"]  # each effect ran once overall
    reader = afk.Store(root).open("agent")
    assert reader.meta.status == "completed"
    assert reader.resume_state().result == EXPECTED_OUTPUT
    assert reader.verify().ok
    # the model responses are in the journal as JSON, not pickles
    (first,) = [
        e for e in reader.effects() if e.key == "openai-agents.model#1" and e.kind == "outcome"
    ]
    assert json.loads(first.result["messages"])["output"][0]["call_id"] == "call-a"
    # beside it, what decided the call: one digest per message, per tool, the output type
    assert set(first.result["request"]) == {"messages", "tools", "output", "model"}
    assert list(first.result["request"]["tools"]) == ["record"]


def test_a_plain_tool_killed_mid_call_is_reported_in_doubt(tmp_path: Path) -> None:
    root, files = tmp_path / "store", tmp_path / "files"
    files.mkdir()
    env = env_for(root, files, OA_PLAIN_TOOL="1")
    kill_at(env, "TOOL a", "plain")
    assert effects(files) == ["a"]

    done = afk_local_cli(env, "--root", str(root), "resume", "plain")
    assert done.returncode == 1
    assert "openai-agents.tool.record.call-a#1" in done.stderr
    assert "may or may not have happened" in done.stderr
    assert effects(files) == ["a"]  # not called again behind the user's back
    assert model_requests(files) == ["recorder 1"]


HANDOFF = """
import sys
import openai_agents_jobs
print("OUTPUT " + openai_agents_jobs.handoff_job.run("record", run_id=sys.argv[1]), flush=True)
"""


def test_a_handoff_is_made_once_across_a_kill_inside_the_next_agents_tool(tmp_path: Path) -> None:
    root, files = tmp_path / "store", tmp_path / "files"
    files.mkdir()
    env = env_for(root, files)
    # killed after the handoff (its on_handoff wrote its line), inside the recorder's tool a
    kill_at(env, "TOOL a", "handed", script=HANDOFF)
    assert effects(files) == ["handoff", "a"]
    assert model_requests(files) == ["triage 1", "recorder 3"]

    done = afk_local_cli(env, "--root", str(root), "resume", "handed")
    assert done.returncode == 0, done.stderr
    assert effects(files) == ["handoff", "a", "b"]  # the handoff's callback ran once
    # the triage answer and the recorder's first answer were replayed, not asked again
    assert model_requests(files) == ["triage 1", "recorder 3", "recorder 5", "recorder 7"]
    reader = afk.Store(root).open("handed")
    assert reader.meta.status == "completed"
    assert reader.resume_state().result == f"recorder: {EXPECTED_OUTPUT}"
    keys = [e.key for e in reader.effects() if e.kind == "outcome"]
    assert keys.count("openai-agents.handoff.transfer_to_recorder#1") == 1


STANDALONE = """
import sys
import openai_agents_jobs
print("OUTPUT " + openai_agents_jobs.standalone_run(sys.argv[1], "record two items"), flush=True)
"""


def test_a_killed_standalone_run_is_continued_by_resume_and_the_watcher(tmp_path: Path) -> None:
    root, files = tmp_path / "store", tmp_path / "files"
    files.mkdir()
    env = env_for(root, files)

    # 1. A standalone run (no job: DurableRunner.run_sync(agent, input, run_id=...)),
    #    killed after the first model response, before its tool call.
    kill_at(env, FIRST_TOOL, "alone", script=STANDALONE)
    assert model_requests(files) == ["recorder 1"]

    # 2. afk-local resume finds the module-level agent the run names; killed in tool b.
    lines = kill_at(env, "TOOL b", str(root), "alone", script=CLI_RESUME)
    assert "TOOL a" in lines
    assert model_requests(files) == ["recorder 1", "recorder 3"]
    shown = afk_local_cli(env, "--root", str(root), "show", "alone")
    assert "tool_result record: (in doubt: a kill cut this call short" in shown.stdout

    # 3. The watcher finishes it: nothing asked or done twice.
    done = afk_local_cli(env, "--root", str(root), "watch", "--once", *FAST_WATCH)
    assert done.returncode == 0, done.stderr
    assert model_requests(files) == RECORDER_REQUESTS
    assert effects(files) == ["a", "b"]
    reader = afk.Store(root).open("alone")
    assert reader.meta.status == "completed"
    assert reader.resume_state().result == {
        "final_output": EXPECTED_OUTPUT,
        "last_agent": "recorder",
    }
