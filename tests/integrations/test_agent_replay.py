"""``afk-local replay`` reports an agent run whose tool list or model changed (issue 41).

The run is made in a child under one version of the code; the replay runs in another
child under the version with one tool more (``REPLAY_TOOLS=more``), as a user would
after editing the agent. The model step's journaled input covers the tools the agent
offers, so the first model call no longer matches.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import proc
import pytest
import replay_agent_jobs
from proc import SUPPORT

import afk_local as afk

# Checked without importing them: every test process collects this module, and the
# two frameworks cost about three seconds of CPU to import.
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("agents") is None or importlib.util.find_spec("pydantic_ai") is None,
    reason="needs the OpenAI Agents SDK and pydantic-ai: pip install 'afk_local[test-all]'",
)


def env_for(tmp_path: Path, **more: str) -> dict[str, str]:
    return {
        "PYTHONPATH": str(SUPPORT),
        "OA_EFFECTS": str(tmp_path / "effects.txt"),
        "PAI_EFFECTS": str(tmp_path / "effects.txt"),
        "PAI_MODEL_LOG": str(tmp_path / "model.log"),
        **more,
    }


def replayed_with_more_tools(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, job: str, **change: str
) -> tuple[str, str]:
    """Run ``job`` to its end here, then replay it in a child as it is and in another with
    one tool more (or the environment ``change``); returns what each printed."""
    for name, value in env_for(tmp_path).items():
        if name != "PYTHONPATH":
            monkeypatch.setenv(name, value)
    store = afk.Store(tmp_path / "store")
    getattr(replay_agent_jobs, job).with_store(store).run("record two items", run_id="agent-run")
    effects = (tmp_path / "effects.txt").read_text("utf-8")
    root = str(store.root)
    same = proc.afk_local_cli(env_for(tmp_path), "--root", root, "replay", "agent-run")
    assert same.returncode == 0, same.stdout + same.stderr
    more = proc.afk_local_cli(
        env_for(tmp_path, **(change or {"REPLAY_TOOLS": "more"})),
        "--root",
        root,
        "replay",
        "agent-run",
    )
    assert (tmp_path / "effects.txt").read_text("utf-8") == effects  # no tool ran again
    return same.stdout, more.stdout + more.stderr


def test_an_agents_sdk_run_with_a_changed_tool_list_diverges(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, more = replayed_with_more_tools(tmp_path, monkeypatch, "openai_agents_job")
    assert "DIVERGES at call 1 (openai-agents.model#1)" in more, more
    assert "tool 'lookup' is offered now, not then" in more, more


def test_a_pydantic_ai_run_with_a_changed_tool_list_diverges(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, more = replayed_with_more_tools(tmp_path, monkeypatch, "pydantic_ai_job")
    assert "DIVERGES at call 1 (pydantic-ai.model#1)" in more, more
    assert "tool 'lookup' is offered now, not then" in more, more


@pytest.mark.parametrize(
    ("job", "step", "now"),
    [
        ("openai_agents_job", "openai-agents.model#1", "'gpt-other'"),
        ("pydantic_ai_job", "pydantic-ai.model#1", "'function:gpt-other'"),
    ],
)
def test_an_agent_run_asked_of_another_model_diverges_naming_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, job: str, step: str, now: str
) -> None:
    _, other = replayed_with_more_tools(tmp_path, monkeypatch, job, REPLAY_MODEL="gpt-other")
    assert f"DIVERGES at call 1 ({step})" in other, other
    assert f"the model is {now} now" in other, other
