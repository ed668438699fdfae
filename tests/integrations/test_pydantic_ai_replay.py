"""DurableAgent on replay: a resumed run gets the recorded answers exactly when it asks the
same thing, and says in words what differs when it does not.

Each test runs a job whose first attempt fails on purpose after the agent ran (the
journal keeps every model answer and tool result), then runs it again in the same
process. Killed processes: test_pydantic_ai_crash.py and test_pydantic_ai_sweep.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import afk_local as afk
from afk_local.errors import AgentRequestMismatchError, EffectMismatchError

if TYPE_CHECKING:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse
    from pydantic_ai.models.function import AgentInfo


@pytest.fixture(autouse=True)
def _needs_pydantic_ai() -> None:
    """The tests need pydantic_ai: imported as they run, not as every worker collects the module."""
    pytest.importorskip(
        "pydantic_ai", reason="pydantic-ai not installed: pip install 'afk_local[test]'"
    )


class Charges:
    """A model that asks for one charge per amount (by whatever name the tool has now),
    then reports; it counts what it is asked."""

    def __init__(self, amounts: list[int]) -> None:
        self.amounts = amounts
        self.requests = 0

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart  # noqa: PLC0415

        self.requests += 1
        done = [p.content for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        if len(done) < len(self.amounts):
            (tool,) = [t.name for t in info.function_tools]
            amount = self.amounts[len(done)]
            return ModelResponse(parts=[ToolCallPart(tool, {"amount": amount}, f"c{len(done)}")])
        return ModelResponse(parts=[TextPart(f"charged {done}")])


def charging_job(store: afk.Store, agent: Agent[None, str], failures: list[str]) -> Any:
    """A job running ``agent``; its attempt fails after the agent while ``failures`` lasts."""
    from afk_local.integrations.pydantic_ai import DurableAgent  # noqa: PLC0415

    durable_agent = DurableAgent(agent)

    @afk.durable(store=store)
    def job(ctx: afk.RunContext) -> str:
        output = durable_agent.run_sync(ctx, "charge").output
        if failures:
            raise RuntimeError(failures.pop())
        return output

    return job


def agent_with_tool(model: Charges, name: str, charged: list[int]) -> Agent[None, str]:
    from pydantic_ai import Agent  # noqa: PLC0415
    from pydantic_ai.models.function import FunctionModel  # noqa: PLC0415

    agent = Agent(FunctionModel(model))

    def charge(amount: int) -> str:
        charged.append(amount)
        return f"ok {amount}"

    agent.tool_plain(name=name)(charge)
    return agent


def test_two_answers_recorded_in_one_attempt_replay_as_they_were_asked(tmp_path: Path) -> None:
    """Issue 39 item 1: pydantic-ai stamps model_id only on the answers it asked for, so a
    replayed history once differed from the live one at the second model call."""
    model, charged = Charges([5, 7]), []
    agent = agent_with_tool(model, "charge", charged)
    job = charging_job(afk.Store(tmp_path), agent, ["planned failure after the agent ran"])
    with pytest.raises(RuntimeError, match="planned failure"):
        job.run(run_id="two-answers")
    assert (model.requests, charged) == (3, [5, 7])

    assert job.run(run_id="two-answers") == "charged ['ok 5', 'ok 7']"
    assert (model.requests, charged) == (3, [5, 7])  # all replayed: nothing asked, nothing run


def test_a_renamed_tool_is_a_mismatch_never_an_unrecorded_model_call(tmp_path: Path) -> None:
    """Issue 39 item 4: the tools offered are part of what a model call is checked against."""
    model, charged = Charges([5]), []
    store = afk.Store(tmp_path)
    first = charging_job(store, agent_with_tool(model, "charge", charged), ["planned failure"])
    with pytest.raises(RuntimeError, match="planned failure"):
        first.run(run_id="renamed")
    assert (model.requests, charged) == (2, [5])

    renamed = charging_job(store, agent_with_tool(model, "charge_card", charged), [])
    with pytest.raises(AgentRequestMismatchError) as caught:
        renamed.run(run_id="renamed")
    assert (model.requests, charged) == (2, [5])  # no model asked, no charge made again
    message = str(caught.value)
    assert "'pydantic-ai.model#1'" in message
    assert "tool 'charge_card' is offered now, not then" in message
    assert "tool 'charge' was offered then, not now" in message
    assert isinstance(caught.value, EffectMismatchError)


def test_a_mismatch_says_which_message_differs_without_hashes_or_fork_advice(
    tmp_path: Path,
) -> None:
    """Issue 39 item 8: words, not digests; and no fork, which cannot help an agent run."""
    from afk_local.integrations.pydantic_ai import DurableAgent  # noqa: PLC0415

    model, charged = Charges([5]), []
    agent = agent_with_tool(model, "charge", charged)
    prompts = ["charge 5", "charge 6"]  # the prompt changed between two attempts
    durable_agent = DurableAgent(agent)

    @afk.durable(store=afk.Store(tmp_path))
    def job(ctx: afk.RunContext) -> str:
        output = durable_agent.run_sync(ctx, prompts[0]).output
        if len(prompts) == 2:
            prompts.pop(0)
            raise RuntimeError("planned failure after the agent ran")
        return output

    with pytest.raises(RuntimeError, match="planned failure"):
        job.run(run_id="changed")
    with pytest.raises(AgentRequestMismatchError) as caught:
        job.run(run_id="changed")
    message = str(caught.value)
    assert "message 1 of 1, the user prompt 'charge 6', is not the one" in message
    assert not re.search(r"[0-9a-f]{16}", message), message
    assert "fork" in message and "a fork cannot" in message  # only to say it cannot help
    assert "the code or its inputs changed" not in message
    assert caught.value.differences == [
        "message 1 of 1, the user prompt 'charge 6', is not the one the recorded call sent"
    ]


def test_a_model_retry_is_the_tools_outcome_and_is_not_run_again(tmp_path: Path) -> None:
    """Issue 39 item 5: what a tool did before it raised ModelRetry is not repeated."""
    from pydantic_ai import Agent, ModelRetry  # noqa: PLC0415
    from pydantic_ai.messages import (  # noqa: PLC0415
        ModelResponse,
        RetryPromptPart,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
    )
    from pydantic_ai.models.function import FunctionModel  # noqa: PLC0415

    effects: list[int] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        parts = [p for m in messages for p in m.parts]
        # a ModelRetry comes back as a tool return marked "retried" (or a retry prompt)
        returns = [p for p in parts if isinstance(p, ToolReturnPart)]
        if any(p.outcome != "retried" for p in returns):
            return ModelResponse(parts=[TextPart("booked")])
        retried = len(returns) + sum(isinstance(p, RetryPromptPart) for p in parts)
        return ModelResponse(parts=[ToolCallPart("book", {"seat": retried}, f"book-{retried}")])

    agent = Agent(FunctionModel(model))

    @agent.tool_plain
    def book(seat: int) -> str:
        effects.append(seat)  # the side effect happens before the tool asks for a retry
        if seat == 0:
            raise ModelRetry("seat 0 is taken, pick another")
        return f"seat {seat}"

    job = charging_job(afk.Store(tmp_path), agent, ["planned failure"])
    with pytest.raises(RuntimeError, match="planned failure"):
        job.run(run_id="retry")
    assert effects == [0, 1]

    assert job.run(run_id="retry") == "booked"
    assert effects == [0, 1]  # the retried call was replayed as the model retry it was


def test_run_sync_finds_its_job_without_ctx(tmp_path: Path) -> None:
    """Issue 39 item 9: called as pydantic-ai's run_sync(prompt) is, inside a job."""
    from afk_local.integrations.pydantic_ai import DurableAgent  # noqa: PLC0415

    model, charged = Charges([5]), []
    durable_agent = DurableAgent(agent_with_tool(model, "charge", charged))

    @afk.durable(store=afk.Store(tmp_path))
    def job(ctx: afk.RunContext) -> str:
        return durable_agent.run_sync("charge 5").output

    assert job.run(run_id="no-ctx") == "charged ['ok 5']"
    keys = [e.key for e in afk.Store(tmp_path).open("no-ctx").effects() if e.kind == "outcome"]
    assert keys[0] == "pydantic-ai.model#1" and keys[1].startswith("pydantic-ai.tool.charge.")
    assert job.run(run_id="no-ctx") == "charged ['ok 5']"
    assert (model.requests, charged) == (2, [5])


def test_model_calls_take_a_retry_and_a_limit(tmp_path: Path) -> None:
    """Parity: afk.Retry and afk.Limit on model calls, as on any step."""
    from pydantic_ai import Agent  # noqa: PLC0415
    from pydantic_ai.messages import ModelResponse, TextPart  # noqa: PLC0415
    from pydantic_ai.models.function import FunctionModel  # noqa: PLC0415

    from afk_local.integrations.pydantic_ai import DurableAgent  # noqa: PLC0415

    calls = 0

    def flaky(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("the provider dropped the connection")
        return ModelResponse(parts=[TextPart("fine")])

    durable_agent = DurableAgent(
        Agent(FunctionModel(flaky)),
        model_retry=afk.Retry(3, initial=0),
        model_limit=afk.Limit("provider", concurrent=1),
    )

    @afk.durable(store=afk.Store(tmp_path))
    def job(ctx: afk.RunContext) -> str:
        return durable_agent.run_sync(ctx, "hi").output

    assert job.run(run_id="flaky") == "fine"
    assert calls == 2
    effects = afk.Store(tmp_path).open("flaky").effects()
    outcomes = [e.status for e in effects if e.kind == "outcome" and e.key == "pydantic-ai.model#1"]
    assert outcomes == ["error", "ok"]


def test_an_event_stream_handler_sees_the_run_and_its_replay_without_asking_again(
    tmp_path: Path,
) -> None:
    """Parity with DBOS: an event_stream_handler streams the model requests, which are
    journaled as any; on replay it gets each recorded answer whole (no deltas) and the
    recorded tool result, while neither the model nor the tool runs again."""
    from pydantic_ai import Agent  # noqa: PLC0415
    from pydantic_ai.messages import ToolReturnPart  # noqa: PLC0415
    from pydantic_ai.models.function import DeltaToolCall, FunctionModel  # noqa: PLC0415

    from afk_local.integrations.pydantic_ai import DurableAgent  # noqa: PLC0415

    asked, charged = [], []

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> Any:
        asked.append(len(messages))
        done = [p.content for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        if not done:
            yield {0: DeltaToolCall("charge", '{"amount": 5}', tool_call_id="c1")}
        else:
            yield "charged "
            yield str(done)

    agent = Agent(FunctionModel(stream_function=stream))

    @agent.tool_plain
    def charge(amount: int) -> str:
        charged.append(amount)
        return f"ok {amount}"

    events: list[list[str]] = []

    async def handler(ctx: Any, stream: Any) -> None:
        async for event in stream:
            events[-1].append(type(event).__name__)

    durable_agent = DurableAgent(agent)
    attempts = []

    @afk.durable(store=afk.Store(tmp_path))
    def job(ctx: afk.RunContext) -> str:
        events.append([])
        output = durable_agent.run_sync("charge 5", event_stream_handler=handler).output
        attempts.append(output)
        if len(attempts) == 1:
            raise RuntimeError("the first attempt fails after the agent ran")
        return output

    with pytest.raises(RuntimeError, match="first attempt"):
        job.run(run_id="events")
    assert job.run(run_id="events") == "charged ['ok 5']"
    assert (len(asked), charged) == (2, [5])  # replayed: neither asked nor charged again
    live, replayed = events
    assert "PartDeltaEvent" in live and "PartDeltaEvent" not in replayed
    for seen in (live, replayed):
        assert {"PartStartEvent", "FunctionToolCallEvent", "FunctionToolResultEvent"} <= set(seen)
