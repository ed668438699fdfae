"""A durable job running a pydantic-ai agent, for the crash tests of the pydantic-ai integration.

Importable as ``pydantic_ai_jobs`` (tests/support is on sys.path and on the children's
PYTHONPATH), so the run's entrypoint resolves in ``afk-local resume``.

The model is a ``FunctionModel`` that appends one line per request it is asked to a
log file (``PAI_MODEL_LOG``): the number of messages it was sent. It asks for the tool
``record`` twice (items ``a`` then ``b``), then answers with the tool results. The
tool appends ``item key`` to ``PAI_EFFECTS`` like a service that drops a call whose
idempotency key it already saw (unless ``PAI_PLAIN_TOOL`` is set: then it appends
blindly and is not idempotent). The child prints ``STEP <key>`` as each journaled step
starts and ``TOOL <item>`` once a tool's effect happened; when a line equals
``PAI_STALL_AT`` the child stalls there so the parent can SIGKILL it at that point.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from pathlib import Path

from pydantic import BaseModel
from pydantic_ai import Agent, DeferredToolRequests, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

import afk_local as afk
from afk_local.integrations.pydantic_ai import DurableAgent, tool_idempotency_key
from afk_local.runner.run.run_context import set_step_hook


def say(line: str) -> None:
    """Print ``line`` for the parent; stall if the parent wants to kill us right here."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
    if os.environ.get("PAI_STALL_AT") == line:
        time.sleep(120)  # the parent SIGKILLs us; never reached in a finished test


def _on_step(kind: str, key: str) -> None:
    say(f"STEP {key}")


def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The model: deterministic in the conversation it is sent; logs every request."""
    with open(os.environ["PAI_MODEL_LOG"], "a", encoding="utf-8") as fh:
        fh.write(f"{len(messages)}\n")
    returns = [
        part.content
        for message in messages
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    ]
    if len(returns) < 2:
        item = "ab"[len(returns)]
        call = ToolCallPart("record", {"item": item}, tool_call_id=f"call-{item}")
        return ModelResponse(parts=[call])
    return ModelResponse(parts=[TextPart("recorded " + ", ".join(map(str, returns)))])


agent = Agent(FunctionModel(answer), instructions="Record a, then b.")


@agent.tool_plain
def record(item: str) -> str:
    """Record ``item`` in the outside file: the side effect."""
    target = Path(os.environ["PAI_EFFECTS"])
    if os.environ.get("PAI_PLAIN_TOOL"):
        with open(target, "a", encoding="utf-8") as fh:
            fh.write(f"{item}\n")
    else:
        key = tool_idempotency_key()
        seen = target.read_text("utf-8").split("\n") if target.exists() else []
        if f"{item} {key}" not in seen:
            with open(target, "a", encoding="utf-8") as fh:
                fh.write(f"{item} {key}\n")
    say(f"TOOL {item}")
    return f"{item}-ok"


durable_agent = DurableAgent(
    agent, idempotent_tools=() if os.environ.get("PAI_PLAIN_TOOL") else {"record"}
)


@afk.durable
def agent_job(ctx: afk.RunContext, prompt: str) -> str:
    """Run the agent on ``prompt`` durably; returns its output."""
    set_step_hook(_on_step)
    output: str = durable_agent.run_sync(ctx, prompt).output
    return output


def ask_to_ship(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """A model that asks for ``ship`` once (a tool that needs approval), then reports."""
    with open(os.environ["PAI_MODEL_LOG"], "a", encoding="utf-8") as fh:
        fh.write(f"{len(messages)}\n")
    returns = [p.content for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
    if not returns:
        return ModelResponse(parts=[ToolCallPart("ship", {"order": 7}, tool_call_id="ship-7")])
    return ModelResponse(parts=[TextPart(f"shipping: {returns[0]}")])


approval_agent = Agent(FunctionModel(ask_to_ship), output_type=[str, DeferredToolRequests])


@approval_agent.tool_plain(requires_approval=True)
def ship(order: int) -> str:
    """Ship an order: the side effect a person approves first."""
    with open(os.environ["PAI_EFFECTS"], "a", encoding="utf-8") as fh:
        fh.write(f"ship {order}\n")
    return f"order {order} shipped"


approval_durable_agent = DurableAgent(approval_agent)
"""The same agent for standalone runs (``approval_durable_agent.run_sync(prompt, run_id=...)``)."""


@afk.durable
def approval_job(ctx: afk.RunContext) -> str:
    """Ships order 7 once a person approved it (the run pauses until then)."""
    result = DurableAgent(approval_agent).run_sync(ctx, "ship order 7")
    return str(result.output)


# -- parallel tool calls, one of them failing (issue 39 item 2) -------------------------

_effect_done = threading.Event()
_explode_started = threading.Event()


def both_tools(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """A model that calls ``record`` and ``explode`` at once, then reports their results."""
    with open(os.environ["PAI_MODEL_LOG"], "a", encoding="utf-8") as fh:
        fh.write(f"{len(messages)}\n")
    returns = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
    if not returns:
        record = ToolCallPart("record_slowly", {"item": "a"}, tool_call_id="call-record")
        explode = ToolCallPart("explode", {}, tool_call_id="call-explode")
        return ModelResponse(parts=[record, explode])
    return ModelResponse(parts=[TextPart(" ".join(sorted(str(p.content) for p in returns)))])


parallel_agent = Agent(FunctionModel(both_tools))


@parallel_agent.tool_plain
async def record_slowly(item: str) -> str:
    """Record ``item`` (the effect), then take a moment before answering."""
    with open(os.environ["PAI_EFFECTS"], "a", encoding="utf-8") as fh:
        fh.write(f"{item}\n")
    if os.environ.get("PAI_EXPLODE"):  # the sibling is in flight too (its intent journaled)
        await asyncio.to_thread(_explode_started.wait, 60)
    say(f"TOOL {item}")
    _effect_done.set()
    await asyncio.sleep(0.5)  # the sibling fails while this call is still in flight
    return f"{item}-ok"


@parallel_agent.tool_plain
async def explode() -> str:
    """With ``PAI_EXPLODE`` set: fail once the sibling's effect happened."""
    if os.environ.get("PAI_EXPLODE"):
        _explode_started.set()
        await asyncio.to_thread(_effect_done.wait, 60)
        raise RuntimeError("explode failed while record_slowly was in flight")
    return "explode-ok"


@afk.durable
def parallel_job(ctx: afk.RunContext) -> str:
    """The parallel agent, durably: record_slowly's effect must happen once overall."""
    set_step_hook(_on_step)
    output: str = DurableAgent(parallel_agent).run_sync(ctx, "record and explode").output
    return output


class Invoice(BaseModel):
    """A structured output type (the standalone tests' finished run)."""

    customer: str
    amount: int


def greeting_agent() -> Agent[str, str]:
    """An agent whose one tool reads its deps (a tool's ``RunContext`` annotation is
    resolved in its module's globals, so it is defined here, not in a test)."""
    agent = Agent(TestModel(call_tools=["greet"]), deps_type=str)

    @agent.tool
    def greet(ctx: RunContext[str]) -> str:
        return f"hello {ctx.deps}"

    return agent
