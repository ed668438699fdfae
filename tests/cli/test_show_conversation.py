"""``afk-local show`` and ``inspect --conversation`` print an agent run's conversation.

Runs made here in-process (a pydantic-ai DurableAgent, an AgentRunner agent); read back
through the real CLI in a child process. A run killed in a tool call shows the call in
doubt: test_pydantic_ai_crash.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import proc
import pytest

import afk_local as afk

needs_pydantic_ai = pytest.mark.skipif(
    importlib.util.find_spec("pydantic_ai") is None,
    reason="pydantic-ai not installed: pip install 'afk_local[test-all]'",
)


LONG = "x" * 5000


def cli(root: Path, *args: str, code: int = 0) -> str:
    """``python -m afk_local --root ROOT args...``: its stdout; asserts the exit code."""
    env = {k: v for k, v in os.environ.items() if k != "AFK_LOCAL_ROOT"}
    done = proc.python(["-m", "afk_local", "--root", str(root), *args], env=env, timeout=120)
    assert done.returncode == code, (args, done.stdout, done.stderr)
    return done.stdout if code == 0 else done.stderr


def pydantic_ai_run(root: Path) -> None:
    """A standalone DurableAgent run: a prompt, two tool calls, a long final answer.

    pydantic-ai is imported here, not at the top: every test process collects this
    module, and the framework costs about a second and a half of CPU to import."""
    from pydantic_ai import Agent  # noqa: PLC0415
    from pydantic_ai.messages import (  # noqa: PLC0415
        ModelMessage,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel  # noqa: PLC0415

    from afk_local.integrations.pydantic_ai import DurableAgent  # noqa: PLC0415

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        done = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        if len(done) < 2:
            n = (2, 3)[len(done)]
            return ModelResponse(parts=[ToolCallPart("square", {"n": n}, tool_call_id=f"c{n}")])
        return ModelResponse(parts=[TextPart("squares 4 and 9 " + LONG)])

    agent = Agent(FunctionModel(model), instructions="Square what you are given.")

    @agent.tool_plain
    def square(n: int) -> int:
        return n * n

    DurableAgent(agent).run_sync("square 2 and 3", run_id="squares", store=root)


@needs_pydantic_ai
def test_show_prints_a_durable_agents_conversation_in_order(tmp_path: Path) -> None:
    pydantic_ai_run(tmp_path)
    shown = cli(tmp_path, "show", "squares")
    raw = shown.splitlines()
    start = next(i for i, line in enumerate(raw) if line.startswith("conversation "))
    column = raw[start].index("instructions: ")
    lines = [line[column:] for line in raw]
    assert lines[start] == "instructions: Square what you are given."
    start += 1
    assert lines[start : start + 5] == [
        "user: square 2 and 3",
        'tool_call square: {"n": 2}',
        "tool_result square: 4",
        'tool_call square: {"n": 3}',
        "tool_result square: 9",
    ]
    assert lines[start + 5].startswith("assistant: squares 4 and 9 xxx")
    assert lines[start + 5].endswith(f"[{len('squares 4 and 9 ' + LONG) - 200} more chars]")
    assert "inspect squares --conversation" in shown

    facts = json.loads(cli(tmp_path, "show", "squares", "--json"))
    entries = facts["conversation"]["entries"]
    assert [(e["role"], e.get("tool")) for e in entries] == [
        ("instructions", None),
        ("user", None),
        ("tool_call", "square"),
        ("tool_result", "square"),
        ("tool_call", "square"),
        ("tool_result", "square"),
        ("assistant", None),
    ]
    assert [e.get("tool_call_id") for e in entries[2:6]] == ["c2", "c2", "c3", "c3"]
    assert entries[-1]["truncated"] == len("squares 4 and 9 " + LONG) - 200
    assert len(entries[-1]["text"]) == 200
    assert facts["conversation"]["truncated"] == 1


@needs_pydantic_ai
def test_inspect_conversation_prints_all_of_it_cut_to_a_bound(tmp_path: Path) -> None:
    pydantic_ai_run(tmp_path)
    shown = cli(tmp_path, "inspect", "squares", "--conversation").splitlines()
    assert shown[:2] == ["instructions: Square what you are given.", "user: square 2 and 3"]
    assert shown[-2].endswith(f"[{len('squares 4 and 9 ' + LONG) - 2000} more chars]")
    assert shown[-1] == "(1 long entries cut at 2000 characters)"

    found = json.loads(cli(tmp_path, "inspect", "squares", "--conversation", "--json"))
    assert found["source"] == "pydantic-ai"
    assert len(found["entries"]) == 7
    assert len(found["entries"][-1]["text"]) == 2000


def test_an_agent_runner_run_shows_its_conversation_too(tmp_path: Path) -> None:
    def llm(messages: list[dict[str, Any]], tools: Any) -> afk.LLMResponse:
        if messages[-1]["role"] == "tool":
            return afk.LLMResponse(text=f"it is {messages[-1]['content']}")
        return afk.LLMResponse(
            tool_calls=[afk.ToolCall(id="d1", name="double", arguments={"x": 4})]
        )

    def double(x: int) -> int:
        """Double x."""
        return 2 * x

    agent = afk.Agent("doubler", "You double.", llm, {"double": double})
    afk.AgentRunner(afk.Store(tmp_path)).run(agent, "double 4", run_id="doubled")
    found = json.loads(cli(tmp_path, "inspect", "doubled", "--conversation", "--json"))
    assert found["source"] == "agent"
    assert [(e["role"], e.get("tool"), e["text"]) for e in found["entries"]] == [
        ("system", None, "You double."),
        ("user", None, "double 4"),
        ("tool_call", "double", '{"x": 4}'),
        ("tool_result", "double", "8"),
        ("assistant", None, "it is 8"),
    ]
    assert "user: double 4" in cli(tmp_path, "show", "doubled")


def test_a_run_without_a_conversation_says_so(tmp_path: Path) -> None:
    @afk.durable(store=tmp_path)
    def plain(ctx: afk.RunContext) -> int:
        return 1

    plain.run(run_id="plain")
    assert "user:" not in cli(tmp_path, "show", "plain")
    assert json.loads(cli(tmp_path, "show", "plain", "--json"))["conversation"] is None
    error = cli(tmp_path, "inspect", "plain", "--conversation", code=2)
    assert "holds no conversation" in error
