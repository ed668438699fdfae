"""DurableAgent on its own (``run_sync(prompt, run_id=...)``), in one process.

Killed processes, ``afk-local resume`` and the watcher on standalone runs:
test_pydantic_ai_crash.py (its ``standalone`` cases).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import afk_local as afk
from afk_local.runner.code.origin import cannot_resume

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
    """Asks for ``square`` once per item, then sums up; counts the requests it is asked."""

    def __init__(self, items: list[int]) -> None:
        self.items = items
        self.requests = 0

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart  # noqa: PLC0415

        self.requests += 1
        returns = [p.content for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        if len(returns) < len(self.items):
            return ModelResponse(parts=[ToolCallPart("square", {"n": self.items[len(returns)]})])
        return ModelResponse(parts=[TextPart(f"squares {returns}")])


def squaring_agent(script: Scripted, calls: list[int]) -> DurableAgent[None, str]:
    from pydantic_ai import Agent  # noqa: PLC0415
    from pydantic_ai.models.function import FunctionModel  # noqa: PLC0415

    from afk_local.integrations.pydantic_ai import DurableAgent  # noqa: PLC0415

    agent = Agent(FunctionModel(script))

    @agent.tool_plain
    def square(n: int) -> int:
        calls.append(n)
        return n * n

    return DurableAgent(agent, idempotent_tools={"square"})


def test_a_standalone_run_is_a_run_and_a_finished_one_answers_from_disk(tmp_path: Path) -> None:
    script, calls = Scripted([2, 3]), []
    durable_agent = squaring_agent(script, calls)

    first = durable_agent.run_sync("square 2 and 3", run_id="squares", store=tmp_path)
    assert first.output == "squares [4, 9]"
    assert (script.requests, calls) == (3, [2, 3])

    again = durable_agent.run_sync("square 2 and 3", run_id="squares", store=tmp_path)
    assert again.output == first.output
    assert again.all_messages() == first.all_messages()
    assert (script.requests, calls) == (3, [2, 3])  # neither the model nor the tool again

    reader = afk.Store(tmp_path).open("squares")
    assert reader.meta.status == "completed"
    assert reader.meta.extra["kind"] == "pydantic-ai"
    steps = [e.name.rpartition(".pyd_ai")[0] or e.name for e in reader.effects() if e.name]
    assert steps == ["pydantic-ai.model", "pydantic-ai.tool.square"] * 2 + ["pydantic-ai.model"]
    # made inside a function: no other process can find it, and show says so
    assert "made inside a function" in (cannot_resume(reader.meta) or "")


def test_another_prompt_under_the_same_run_id_is_refused(tmp_path: Path) -> None:
    durable_agent = squaring_agent(Scripted([2]), [])
    durable_agent.run_sync("square 2", run_id="r", store=tmp_path)
    with pytest.raises(ValueError, match="started with other arguments"):
        durable_agent.run_sync("square 3", run_id="r", store=tmp_path)


def test_a_structured_output_comes_back_as_its_type(tmp_path: Path) -> None:
    import pydantic_ai_jobs as jobs  # noqa: PLC0415
    from pydantic_ai import Agent  # noqa: PLC0415
    from pydantic_ai.models.test import TestModel  # noqa: PLC0415

    from afk_local.integrations.pydantic_ai import DurableAgent  # noqa: PLC0415

    model = TestModel(custom_output_args={"customer": "ada", "amount": 42})
    durable_agent = DurableAgent(Agent(model, output_type=jobs.Invoice))
    first = durable_agent.run_sync("bill ada", run_id="bill", store=tmp_path)
    again = durable_agent.run_sync("bill ada", run_id="bill", store=tmp_path)
    assert first.output == again.output == jobs.Invoice(customer="ada", amount=42)
    assert isinstance(again.output, jobs.Invoice)


def test_the_async_form_and_the_store_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AFK_LOCAL_ROOT", str(tmp_path))
    script, calls = Scripted([4]), []
    durable_agent = squaring_agent(script, calls)
    result = asyncio.run(durable_agent.run("square 4", run_id="async-squares"))
    assert result.output == "squares [16]"
    assert afk.Store(tmp_path).open("async-squares").meta.status == "completed"
    assert asyncio.run(durable_agent.run("square 4", run_id="async-squares")).output == (
        "squares [16]"
    )
    assert script.requests == 2


def test_keyword_arguments_reach_the_agent_but_tie_the_run_to_this_code(tmp_path: Path) -> None:
    import pydantic_ai_jobs as jobs  # noqa: PLC0415

    from afk_local.integrations.pydantic_ai import DurableAgent  # noqa: PLC0415

    durable_agent = DurableAgent(
        jobs.greeting_agent(), entrypoint="agents:greeter"
    )  # importable, but...
    result = durable_agent.run_sync("greet", run_id="greet", store=tmp_path, deps="ada")
    assert "hello ada" in result.output
    meta = afk.Store(tmp_path).read_meta("greet")
    assert "keyword arguments for the agent (deps)" in (cannot_resume(meta) or "")


def test_an_agent_in_a_script_is_continued_by_running_the_script_again(tmp_path: Path) -> None:
    from pydantic_ai import Agent  # noqa: PLC0415
    from pydantic_ai.models.test import TestModel  # noqa: PLC0415

    from afk_local.integrations.pydantic_ai import DurableAgent  # noqa: PLC0415

    durable_agent = DurableAgent(Agent(TestModel()), entrypoint="__main__:durable_agent")
    durable_agent.run_sync("hi", run_id="scripted", store=tmp_path)
    meta = afk.Store(tmp_path).read_meta("scripted")
    assert meta.entrypoint == "__main__:durable_agent"
    assert "run the script again with the same run id" in (cannot_resume(meta) or "")


def test_wrong_calls_say_what_to_pass(tmp_path: Path) -> None:
    from pydantic_ai import Agent  # noqa: PLC0415
    from pydantic_ai.models.test import TestModel  # noqa: PLC0415

    from afk_local.integrations.pydantic_ai import DurableAgent  # noqa: PLC0415

    durable_agent = squaring_agent(Scripted([1]), [])
    with pytest.raises(TypeError, match="needs run_id"):
        durable_agent.run_sync("square 1")

    @afk.durable(store=tmp_path)
    def job(ctx: afk.RunContext) -> Any:
        return durable_agent.run_sync(ctx, "square 1", run_id="nested").output

    with pytest.raises(TypeError, match="pass no run_id= or store= with ctx"):
        job.run(run_id="job")
    with pytest.raises(TypeError, match=r"not an afk\.RunContext"):
        durable_agent.run_sync(object(), "square 1", run_id="x", store=tmp_path)
    with pytest.raises(ValueError, match="expected 'module:name'"):
        DurableAgent(Agent(TestModel()), entrypoint="no colon")


@pytest.mark.parametrize("method", ["run_stream", "run_stream_sync", "run_stream_events", "iter"])
def test_streamed_runs_are_refused_not_run_unjournaled(method: str) -> None:
    durable_agent = squaring_agent(Scripted([1]), [])
    with pytest.raises(NotImplementedError, match="not journaled"):
        getattr(durable_agent, method)("square 1")
