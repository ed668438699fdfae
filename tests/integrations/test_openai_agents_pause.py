"""DurableRunner approvals: a tool call waiting for approval pauses; another process answers.

Real processes: the job pauses in one child, ``afk-local resume RUN --input`` answers
from others. The answer's shape is checked in test_openai_agents.py (in-process).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip(
    "agents", reason="openai-agents not installed: pip install 'afk_local[test-all]'"
)

import proc
from openai_agents_procs import env_for, model_requests
from proc import afk_local_cli

import afk_local as afk

ASK = """
import afk_local as afk
import openai_agents_jobs
try:
    openai_agents_jobs.approval_job.run(run_id="ship")
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
    assert reader.meta.pause is not None
    assert reader.meta.pause.prompt["approvals"] == [
        {"call_id": "ship-7", "tool_name": "ship", "arguments": {"order": 7}}
    ]
    assert model_requests(files) == ["shipper 1"]
    assert not (files / "effects.txt").exists()  # nothing shipped before the answer

    # an answer that does not fit is not taken for a yes: the run asks again, saying why
    wrong = afk_local_cli(env, "--root", str(root), "resume", "ship", "--input", '{"x": true}')
    reader = afk.Store(root).open("ship")
    assert reader.meta.status == "paused", wrong.stderr
    assert reader.meta.pause is not None and "ship-7" in reader.meta.pause.prompt["error"]
    assert not (files / "effects.txt").exists()

    done = afk_local_cli(env, "--root", str(root), "resume", "ship", "--input", '{"ship-7": true}')
    assert done.returncode == 0, done.stderr
    reader = afk.Store(root).open("ship")
    assert reader.meta.status == "completed"
    assert reader.resume_state().result == "shipping: order 7 shipped"
    assert (files / "effects.txt").read_text() == "ship 7\n"
    assert model_requests(files) == ["shipper 1", "shipper 3"]  # the first answer replayed
