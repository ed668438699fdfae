"""Durable jobs running OpenAI Agents SDK agents, for the tests of the openai-agents integration.

Importable as ``openai_agents_jobs`` (tests/support is on sys.path and on the children's
PYTHONPATH), so the run's entrypoint resolves in ``afk-local resume``.

:class:`ScriptedModel` is the fake ``agents.Model``: a function of the input items it is
sent decides its output items, and each request appends one line to ``OA_MODEL_LOG`` (when
set): the model's label and the number of input items. The ``record`` tool asks for items
``a`` then ``b``; the tool appends ``item key`` to ``OA_EFFECTS`` like a service that drops
a call whose idempotency key it already saw (unless ``OA_PLAIN_TOOL`` is set: then it
appends blindly and is not idempotent). The child prints ``STEP <key>`` as each journaled
step starts and ``TOOL <item>`` / ``HANDOFF`` once an effect happened, ``MODEL <label> <n>`` as
the model is asked; when a line equals
``OA_STALL_AT`` the child stalls there so the parent can SIGKILL it at that point.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from agents import (
    Agent,
    Model,
    ModelProvider,
    RunContextWrapper,
    Runner,
    function_tool,
    handoff,
    set_tracing_disabled,
)
from agents.items import ModelResponse, TResponseOutputItem
from agents.usage import Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)
from pydantic import BaseModel

import afk_local as afk
from afk_local.integrations.openai_agents import DurableRunner, RunSession, tool_idempotency_key
from afk_local.runner.run.run_context import set_step_hook

set_tracing_disabled(True)  # no key, no network: traces would go to OpenAI

Script = Callable[[list[Any]], list[TResponseOutputItem]]


def say(line: str) -> None:
    """Print ``line`` for the parent; stall if the parent wants to kill us right here."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
    if os.environ.get("OA_STALL_AT") == line:
        time.sleep(120)  # the parent SIGKILLs us; never reached in a finished test


def _on_step(kind: str, key: str) -> None:
    say(f"STEP {key}")


class ScriptedModel(Model):
    """A fake model: ``script(input items)`` gives its output; it counts (and logs) requests."""

    def __init__(self, script: Script, label: str = "model") -> None:
        self.script = script
        self.label = label
        self.requests = 0

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[Any],
        *args: Any,
        **kwargs: Any,
    ) -> ModelResponse:
        self.requests += 1
        items = [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
        say(f"MODEL {self.label} {len(items)}")
        log = os.environ.get("OA_MODEL_LOG")
        if log:
            with open(log, "a", encoding="utf-8") as fh:
                fh.write(f"{self.label} {len(items)}\n")
        usage = Usage(requests=1, input_tokens=10, output_tokens=5, total_tokens=15)
        return ModelResponse(output=self.script(items), usage=usage, response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the scripted model does not stream")


def tool_call(name: str, arguments: dict[str, Any], call_id: str) -> ResponseFunctionToolCall:
    """A function call item as the Responses API returns it."""
    return ResponseFunctionToolCall(
        type="function_call",
        name=name,
        arguments=json.dumps(arguments),
        call_id=call_id,
        id=f"fc_{call_id}",
        status="completed",
    )


def message(text: str) -> ResponseOutputMessage:
    """An assistant message item with ``text``."""
    content = ResponseOutputText(type="output_text", text=text, annotations=[])
    return ResponseOutputMessage(
        type="message", id="msg_1", role="assistant", status="completed", content=[content]
    )


def tool_outputs(items: list[Any], prefix: str = "call-") -> list[str]:
    """The outputs of the function calls whose id starts with ``prefix``, in order."""
    return [
        str(item["output"])
        for item in items
        if isinstance(item, dict)
        and item.get("type") == "function_call_output"
        and str(item.get("call_id", "")).startswith(prefix)
    ]


def record_twice(items: list[Any]) -> list[TResponseOutputItem]:
    """Ask for ``record`` of ``a``, then of ``b``, then report what the tool returned."""
    done = tool_outputs(items)
    if len(done) < 2:
        item = "ab"[len(done)]
        return [tool_call("record", {"item": item}, f"call-{item}")]
    return [message("recorded " + ", ".join(done))]


@function_tool
def record(item: str) -> str:
    """Record ``item`` in the outside file: the side effect."""
    target = Path(os.environ["OA_EFFECTS"])
    if os.environ.get("OA_PLAIN_TOOL"):
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


recorder = Agent(name="recorder", model=ScriptedModel(record_twice, "recorder"), tools=[record])


def _idempotent() -> set[str]:
    return set() if os.environ.get("OA_PLAIN_TOOL") else {"record"}


@afk.durable
def agent_job(ctx: afk.RunContext, prompt: str) -> str:
    """Run the recorder agent on ``prompt`` durably (the drop-in form: no ctx passed)."""
    set_step_hook(_on_step)
    result = DurableRunner.run_sync(recorder, prompt, idempotent_tools=_idempotent())
    return str(result.final_output)


def standalone_run(run_id: str, prompt: str) -> str:
    """The recorder agent as a standalone durable run of its own (no job), under ``run_id``."""
    set_step_hook(_on_step)
    result = DurableRunner.run_sync(recorder, prompt, run_id=run_id, idempotent_tools={"record"})
    return str(result.final_output)


# -- a handoff: triage hands the conversation to the recorder ---------------------------------


def hand_over(items: list[Any]) -> list[TResponseOutputItem]:
    """Triage: hand off to the recorder at once."""
    return [tool_call("transfer_to_recorder", {}, "handoff-1")]


def _note_handoff(context: RunContextWrapper[Any]) -> None:
    """The handoff's side effect: a line in the effects file."""
    with open(os.environ["OA_EFFECTS"], "a", encoding="utf-8") as fh:
        fh.write("handoff\n")
    say("HANDOFF")


triage = Agent(
    name="triage",
    model=ScriptedModel(hand_over, "triage"),
    handoffs=[handoff(recorder, on_handoff=_note_handoff)],
)


@afk.durable
def handoff_job(ctx: afk.RunContext, prompt: str) -> str:
    """Triage hands off to the recorder; returns the recorder's final output."""
    set_step_hook(_on_step)
    result = DurableRunner.run_sync(
        ctx, triage, prompt, idempotent_tools={"record", "transfer_to_recorder"}
    )
    return f"{result.last_agent.name}: {result.final_output}"


# -- an approval: ship needs a person's yes ----------------------------------------------------


def ask_to_ship(items: list[Any]) -> list[TResponseOutputItem]:
    """Ask for ``ship`` of order 7 once, then report."""
    done = tool_outputs(items, prefix="ship-")
    if not done:
        return [tool_call("ship", {"order": 7}, "ship-7")]
    return [message(f"shipping: {done[0]}")]


@function_tool(needs_approval=True)
def ship(order: int) -> str:
    """Ship an order: the side effect a person approves first."""
    with open(os.environ["OA_EFFECTS"], "a", encoding="utf-8") as fh:
        fh.write(f"ship {order}\n")
    return f"order {order} shipped"


shipper = Agent(name="shipper", model=ScriptedModel(ask_to_ship, "shipper"), tools=[ship])


@afk.durable
def approval_job(ctx: afk.RunContext) -> str:
    """Ships order 7 once a person approved it (the run pauses until then)."""
    return str(DurableRunner.run_sync(shipper, "ship order 7").final_output)  # drop-in form


# -- a session: the conversation kept in a run's files -----------------------------------------


def echo_turn(items: list[Any]) -> list[TResponseOutputItem]:
    """Answer with how many user messages the conversation holds so far."""
    users = [i for i in items if isinstance(i, dict) and i.get("role") == "user"]
    return [message(f"turn {len(users)}: {users[-1]['content']}")]


chat = Agent(name="chat", model=ScriptedModel(echo_turn, "chat"))


def chat_turn(session_id: str, text: str) -> str:
    """One plain ``Runner.run_sync`` turn with the conversation kept by :class:`RunSession`."""
    session = RunSession(session_id, store=afk.Store())
    return str(Runner.run_sync(chat, text, session=session).final_output)


@afk.durable
def session_job(ctx: afk.RunContext, session_id: str, prompt: str) -> str:
    """The recorder agent run durably with its conversation in ``RunSession(session_id)``."""
    set_step_hook(_on_step)
    session = RunSession(session_id, store=ctx.store)
    result = DurableRunner.run_sync(
        ctx, recorder, prompt, session=session, idempotent_tools={"record"}
    )
    return str(result.final_output)


def scripted_recorder() -> tuple[Agent[Any], ScriptedModel]:
    """``recorder`` with a fresh :class:`ScriptedModel` that records two items (and the model)."""
    model = ScriptedModel(record_twice, "recorder")
    return recorder.clone(model=model), model


# -- parallel tool calls, one of them failing (issue 39 item 3) -------------------------

_effect_done = threading.Event()
_explode_started = threading.Event()


def both_tools(items: list[Any]) -> list[TResponseOutputItem]:
    """Call ``record_slowly`` and ``explode`` at once, then report their results."""
    done = tool_outputs(items, prefix="par-")
    if not done:
        return [
            tool_call("record_slowly", {"item": "a"}, "par-record"),
            tool_call("explode", {}, "par-explode"),
        ]
    return [message(" ".join(sorted(done)))]


@function_tool
async def record_slowly(item: str) -> str:
    """Record ``item`` (the effect), then take a moment before answering."""
    with open(os.environ["OA_EFFECTS"], "a", encoding="utf-8") as fh:
        fh.write(f"{item}\n")
    if os.environ.get("OA_EXPLODE"):  # the sibling is in flight too (its intent journaled)
        await asyncio.to_thread(_explode_started.wait, 60)
    say(f"TOOL {item}")
    _effect_done.set()
    await asyncio.sleep(0.5)  # the sibling fails while this call is still in flight
    return f"{item}-ok"


@function_tool(failure_error_function=None)  # its error ends the run, not a message
async def explode() -> str:
    """With ``OA_EXPLODE`` set: fail once the sibling's effect happened."""
    if os.environ.get("OA_EXPLODE"):
        _explode_started.set()
        await asyncio.to_thread(_effect_done.wait, 60)
        raise RuntimeError("explode failed while record_slowly was in flight")
    return "explode-ok"


parallel = Agent(
    name="parallel", model=ScriptedModel(both_tools, "parallel"), tools=[record_slowly, explode]
)


@afk.durable
def parallel_job(ctx: afk.RunContext) -> str:
    """The parallel agent, durably: record_slowly's effect must happen once overall."""
    set_step_hook(_on_step)
    return str(DurableRunner.run_sync(parallel, "record and explode").final_output)


class Provider(ModelProvider):
    """A model provider that hands out one scripted model by name."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.names: list[str | None] = []

    def get_model(self, model_name: str | None) -> Model:
        self.names.append(model_name)
        return self.model


class FlakyModel(Model):
    """Drops the connection on its first call, then answers; counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        self.calls += 1
        if self.calls == 1:
            raise ConnectionError("the provider dropped the connection")
        return ModelResponse(output=[message("fine")], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


class Invoice(BaseModel):
    """A structured output type (the drop-in tests' standalone run)."""

    customer: str
    amount: int
