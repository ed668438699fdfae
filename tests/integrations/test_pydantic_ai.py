"""DurableAgent in one process: what is journaled, replayed, refused.

Killed processes: test_pydantic_ai_crash.py.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import afk_local as afk
from afk_local.errors import EffectMismatchError

if TYPE_CHECKING:
    from pydantic_ai.messages import ModelMessage, ModelResponse
    from pydantic_ai.models.function import AgentInfo

    from afk_local.integrations.pydantic_ai import DurableAgent


@pytest.fixture(autouse=True)
def _needs_pydantic_ai() -> None:
    """The tests need pydantic_ai: imported as they run, not as every worker collects the module."""
    pytest.importorskip(
        "pydantic_ai", reason="pydantic-ai not installed: pip install 'afk_local[test-all]'"
    )


class Scripted:
    """A FunctionModel script: one tool call per item, then a summary; counts its requests."""

    def __init__(self, items: list[int]) -> None:
        self.items = items
        self.requests = 0

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        from pydantic_ai.messages import (  # noqa: PLC0415
            ModelResponse,
            RetryPromptPart,
            TextPart,
            ToolCallPart,
            ToolReturnPart,
        )

        self.requests += 1
        parts = [p for m in messages for p in m.parts]
        # a ModelRetry comes back as a tool return marked "retried" (or a retry prompt)
        tool_returns = [p for p in parts if isinstance(p, ToolReturnPart)]
        returns = [p.content for p in tool_returns if p.outcome != "retried"]
        retries = (
            len(tool_returns) - len(returns) + sum(isinstance(p, RetryPromptPart) for p in parts)
        )
        if len(returns) < len(self.items):
            item = self.items[len(returns)] + retries
            return ModelResponse(parts=[ToolCallPart("square", {"n": item})])
        return ModelResponse(parts=[TextPart(f"squares {returns}")])


def make_agent(script: Scripted, calls: list[tuple[int, str]]) -> DurableAgent[None, str]:
    from pydantic_ai import Agent, ModelRetry  # noqa: PLC0415
    from pydantic_ai.models.function import FunctionModel  # noqa: PLC0415

    from afk_local.integrations.pydantic_ai import DurableAgent, tool_idempotency_key  # noqa: PLC0415

    agent = Agent(FunctionModel(script))

    @agent.tool_plain
    def square(n: int) -> dict[str, Any]:
        if n < 0:
            raise ModelRetry("n must not be negative")
        calls.append((n, tool_idempotency_key()))
        return {"n": n, "square": n * n}

    return DurableAgent(agent, idempotent_tools={"square"})


def test_every_model_request_and_tool_call_is_a_journaled_step(tmp_path: Path) -> None:
    script, calls = Scripted([2, 3]), []
    durable_agent = make_agent(script, calls)

    @afk.durable(store=afk.Store(tmp_path))
    def job(ctx: afk.RunContext) -> str:
        return durable_agent.run_sync(ctx, "square 2 and 3").output

    first = job.run(run_id="squares")
    assert first == "squares [{'n': 2, 'square': 4}, {'n': 3, 'square': 9}]"
    assert (script.requests, [n for n, _ in calls]) == (3, [2, 3])
    effects = afk.Store(tmp_path).open("squares").effects()
    keys = [e.key for e in effects if e.kind == "outcome"]
    assert keys[0] == "pydantic-ai.model#1" and keys[-1] == "pydantic-ai.model#3"
    assert any(k.startswith("pydantic-ai.tool.square.") for k in keys)
    # idempotency keys differ per call and are stable: derived from (run id, step key)
    assert len({key for _, key in calls}) == 2


def test_async_run_and_a_tool_retry_inside_a_durable_job(tmp_path: Path) -> None:
    script, calls = Scripted([-1]), []  # the model first asks for -1, then (retried) 0
    durable_agent = make_agent(script, calls)

    @afk.durable(store=afk.Store(tmp_path))
    async def job(ctx: afk.RunContext) -> str:
        result = await durable_agent.run(ctx, "square -1")
        return result.output

    assert asyncio.run(job.arun(run_id="retry")) == "squares [{'n': 0, 'square': 0}]"
    assert [n for n, _ in calls] == [0]


def test_a_changed_conversation_is_refused_not_answered_from_the_journal(
    tmp_path: Path,
) -> None:
    script, calls = Scripted([2]), []
    durable_agent = make_agent(script, calls)
    prompts = ["square 2", "square 3"]  # the code changed between two attempts

    @afk.durable(store=afk.Store(tmp_path))
    def job(ctx: afk.RunContext) -> str:
        output = durable_agent.run_sync(ctx, prompts[0]).output
        if len(prompts) == 2:
            prompts.pop(0)
            raise RuntimeError("planned failure after the agent ran")
        return output

    with pytest.raises(RuntimeError, match="planned failure"):
        job.run(run_id="changed")
    with pytest.raises(EffectMismatchError, match=re.escape("pydantic-ai.model#1")):
        job.run(run_id="changed")


def test_run_needs_the_jobs_context() -> None:
    durable_agent = make_agent(Scripted([1]), [])
    with pytest.raises(TypeError, match=re.escape("afk.RunContext")):
        durable_agent.run_sync("not a context", "hi")  # type: ignore[arg-type]


def test_parallel_tool_calls_are_each_journaled_under_their_call_id(tmp_path: Path) -> None:
    from pydantic_ai import Agent  # noqa: PLC0415
    from pydantic_ai.messages import (  # noqa: PLC0415
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
    )
    from pydantic_ai.models.function import FunctionModel  # noqa: PLC0415

    from afk_local.integrations.pydantic_ai import DurableAgent  # noqa: PLC0415

    started: list[str] = []

    def both_at_once(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        if not returns:
            calls = [ToolCallPart("fetch", {"url": u}, tool_call_id=f"id-{u}") for u in "xy"]
            return ModelResponse(parts=calls)
        return ModelResponse(parts=[TextPart(" ".join(sorted(str(p.content) for p in returns)))])

    agent = Agent(FunctionModel(both_at_once))

    @agent.tool_plain
    async def fetch(url: str) -> str:
        started.append(url)
        await asyncio.sleep(0.01)  # both calls are in flight together
        return f"page-{url}"

    durable_agent = DurableAgent(agent)

    @afk.durable(store=afk.Store(tmp_path))
    async def job(ctx: afk.RunContext) -> str:
        return (await durable_agent.run(ctx, "fetch x and y")).output

    assert asyncio.run(job.arun(run_id="parallel")) == "page-x page-y"
    assert sorted(started) == ["x", "y"]
    outcomes = {
        e.key for e in afk.Store(tmp_path).open("parallel").effects() if e.kind == "outcome"
    }
    assert {"pydantic-ai.tool.fetch.id-x#1", "pydantic-ai.tool.fetch.id-y#1"} <= outcomes
    assert asyncio.run(job.arun(run_id="parallel")) == "page-x page-y"  # a finished run: its result
    assert sorted(started) == ["x", "y"]
