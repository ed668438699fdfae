"""The run's agents, models, tools and handoffs, each call a journaled step of the job.

:class:`Wrapping` clones the agents a :class:`~afk_local.integrations.openai_agents.DurableRunner`
call runs (the caller's agents are not changed): their models answer through ``ctx.astep``
(:class:`JournaledModel`), their function tools and handoffs run through it too.
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
import weakref
from collections.abc import AsyncIterator
from typing import Any

from agents import Agent, Handoff, Model, ModelProvider, RunConfig, handoff
from agents.items import ModelResponse, TResponseInputItem
from agents.memory.session import Session, SessionABC
from agents.run_context import RunContextWrapper
from agents.tool import FunctionTool, Tool
from agents.tool_context import ToolContext
from pydantic_core import to_jsonable_python

from afk_local.integrations.agent_requests import REQUEST_KEY, check_request, without_model
from afk_local.integrations.openai_agents.responses import (
    call_arguments,
    dump_response,
    load_response,
    model_name,
    request_digest,
    request_fingerprint_of,
)
from afk_local.integrations.openai_agents.session import RunSession
from afk_local.runner.run.run_context import RunContext
from afk_local.runner.time.limits import Limit
from afk_local.runner.time.retry import Retry
from afk_local.storage.views.conversation import OPENAI_AGENTS_HANDOFF_STEP as HANDOFF_STEP
from afk_local.storage.views.conversation import OPENAI_AGENTS_MODEL_STEP as MODEL_STEP
from afk_local.storage.views.conversation import OPENAI_AGENTS_TOOL_STEP as TOOL_STEP

logger = logging.getLogger("afk_local")

SESSION_STEP = "openai-agents.session"

_idempotency_key: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "afk_local_openai_agents_idempotency_key", default=None
)


def tool_idempotency_key() -> str:
    """The idempotency key of the tool call running now, equal across attempts of the run.

    Call it inside a function tool run by :class:`DurableRunner` and hand it to the outside
    service so that it drops a repeated call (a tool named in ``idempotent_tools`` is called
    again after a crash cut it short).

    Raises:
        RuntimeError: outside a tool call of a :class:`DurableRunner` run.
    """
    key = _idempotency_key.get()
    if key is None:
        raise RuntimeError("tool_idempotency_key() is only known inside a DurableRunner tool call")
    return key


class _Sent:
    """The input items of the run's last model call (all its models share one)."""

    def __init__(self) -> None:
        self.items: list[Any] = []

    def new_items(self, input: Any) -> list[Any]:
        """The items of ``input`` the last call did not send (all of them if it is no prefix).

        A model step stores these beside its response, so that ``afk-local show`` can tell
        the conversation from the journal without storing it whole at every call.
        """
        if isinstance(input, str):
            items: list[Any] = [{"role": "user", "content": input}]
        else:
            items = to_jsonable_python(list(input), fallback=repr)
        sent, self.items = self.items, items
        if len(sent) <= len(items) and items[: len(sent)] == sent:
            return items[len(sent) :]
        return items


_SENT: weakref.WeakKeyDictionary[RunContext, _Sent] = weakref.WeakKeyDictionary()


class JournaledModel(Model):
    """A model whose ``get_response`` is a journaled step of the job.

    ``step_options`` go to that step (``retry=`` an ``afk.Retry``, ``limit=`` an
    ``afk.Limit``): each failed try is journaled with its error and the backoff is a
    durable sleep; the call waits for a place under the limit first.
    """

    def __init__(
        self,
        model: Model,
        ctx: RunContext,
        sent: _Sent | None = None,
        step_options: dict[str, Any] | None = None,
    ) -> None:
        self._model = model
        self._ctx = ctx
        self._sent = sent if sent is not None else _Sent()
        self._step_options = dict(step_options or {})

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        """Replay a journaled response, or ask the wrapped model and journal its answer."""
        named = _named_request(args, kwargs)
        asked = {
            "instructions": named.get("system_instructions"),
            "input": self._sent.new_items(named.get("input", [])),
        }

        fingerprint, described = request_fingerprint_of(named, model_name(self._model))

        async def request(argument: Any) -> dict[str, Any]:
            # the request is kept beside the response for `afk-local show`, and what
            # decided the call so that a mismatch can say what differs; replay reads
            # only the response
            response = dump_response(await self._model.get_response(*args, **kwargs), asked)
            return {"messages": response, REQUEST_KEY: fingerprint}

        legacy = request_digest(
            named["system_instructions"], named["input"], named["tools"], named["handoffs"]
        )
        argument = check_request(
            self._ctx,
            MODEL_STEP,
            fingerprint,
            describe=described,
            legacy=[without_model(fingerprint), legacy],
        )
        # A model call reads: when a crash cut it short, asking again is harmless.
        stored: Any = await self._ctx.astep(
            MODEL_STEP, request, argument, idempotent=True, **self._step_options
        )
        if isinstance(stored, dict):  # older runs stored the response alone
            stored = stored["messages"]
        return load_response(stored)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        """Not journaled: streaming runs are not supported by :class:`DurableRunner`."""
        raise NotImplementedError(
            "DurableRunner journals Runner.run and Runner.run_sync; streaming is not supported"
        )

    def get_retry_advice(self, request: Any) -> Any:
        """The wrapped model's retry advice."""
        return self._model.get_retry_advice(request)

    async def close(self) -> None:
        """Close the wrapped model."""
        await self._model.close()

    async def _cleanup_on_run_end(self, owner: object) -> None:
        """The wrapped model's cleanup at the end of a run (the SDK calls it)."""
        await self._model._cleanup_on_run_end(owner)


_GET_RESPONSE_ORDER = (
    "system_instructions",
    "input",
    "model_settings",
    "tools",
    "output_schema",
    "handoffs",
)


def _named_request(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``Model.get_response``'s arguments by name, however the runner passed them."""
    named = dict(zip(_GET_RESPONSE_ORDER, args, strict=False))
    named.update({k: v for k, v in kwargs.items() if k in _GET_RESPONSE_ORDER})
    return named


class _JournaledProvider(ModelProvider):
    """The run's model provider, each model it gives out journaled."""

    def __init__(self, provider: ModelProvider, wrap: Wrapping) -> None:
        self._provider = provider
        self._wrap = wrap

    def get_model(self, model_name: str | None) -> Model:
        """The wrapped provider's model for ``model_name``, journaled."""
        return self._wrap.model(self._provider.get_model(model_name))

    async def aclose(self) -> None:
        """Close the wrapped provider."""
        await self._provider.aclose()


class Wrapping:
    """Clones of the run's agents whose model calls, tools and handoffs are journaled.

    One clone per agent (and one wrapper per model) for the whole call, so that the SDK
    sees the same agent object each time a handoff returns to it.
    """

    def __init__(
        self,
        ctx: RunContext,
        idempotent_tools: frozenset[str],
        *,
        model_retry: Retry | None = None,
        model_limit: Limit | None = None,
    ) -> None:
        self.ctx = ctx
        self.idempotent_tools = idempotent_tools
        self._model_step_options: dict[str, Any] = {}
        if model_retry is not None:
            self._model_step_options["retry"] = model_retry
        if model_limit is not None:
            self._model_step_options["limit"] = model_limit
        self._agents: dict[int, Agent[Any]] = {}
        self._models: dict[int, JournaledModel] = {}
        # one per job attempt, so that a second DurableRunner call in the job (a session's
        # history sent again) keeps only what is new in its first model step too
        self._sent = _SENT.setdefault(ctx, _Sent())

    def model(self, model: Model) -> Model:
        """``model``, its calls journaled (one wrapper per model)."""
        if isinstance(model, JournaledModel):
            return model
        if id(model) not in self._models:
            self._models[id(model)] = JournaledModel(
                model, self.ctx, self._sent, self._model_step_options
            )
        return self._models[id(model)]

    def run_config(self, run_config: RunConfig) -> RunConfig:
        """``run_config`` whose model (or the models its provider gives out) are journaled."""
        changes: dict[str, Any] = {
            "model_provider": _JournaledProvider(run_config.model_provider, self)
        }
        if isinstance(run_config.model, Model):
            changes["model"] = self.model(run_config.model)
        return dataclasses.replace(run_config, **changes)

    def agent(self, agent: Agent[Any]) -> Agent[Any]:
        """The journaled clone of ``agent`` (and of the agents it hands off to)."""
        known = self._agents.get(id(agent))
        if known is not None:
            return known
        clone = agent.clone()
        self._agents[id(agent)] = clone  # before the handoffs: agents may hand off in a cycle
        self._agents[id(clone)] = clone
        if isinstance(agent.model, Model):
            clone.model = self.model(agent.model)
        clone.tools = [self._tool(tool) for tool in agent.tools]
        clone.handoffs = [self._handoff(target) for target in agent.handoffs]
        if clone.mcp_servers:
            self._journal_mcp_tools(clone)
        return clone

    def _journal_mcp_tools(self, clone: Agent[Any]) -> None:
        """Make the tools ``clone``'s MCP servers offer journaled steps, as its own tools are.

        The SDK lists an MCP server's tools at every turn (``Agent.get_mcp_tools``), each
        as a function tool calling the server: each such call becomes a tool step keyed by
        its call id (an MCP tool acts outside the process, so it is in doubt when a kill
        cut it short, unless it is named in ``idempotent_tools``).
        """
        listed = clone.get_mcp_tools

        async def get_mcp_tools(run_context: RunContextWrapper[Any]) -> list[Tool]:
            return [self._tool(tool) for tool in await listed(run_context)]

        # on the clone only (the caller's agent is not changed); the SDK calls it by name
        object.__setattr__(clone, "get_mcp_tools", get_mcp_tools)

    def _tool(self, tool: Tool) -> Tool:
        if not isinstance(tool, FunctionTool):
            return tool  # hosted tools run at the provider; shell/computer tools: not journaled
        invoke = tool.on_invoke_tool
        ctx = self.ctx
        idempotent = tool.name in self.idempotent_tools

        async def journaled(tool_context: ToolContext[Any], tool_input: str) -> Any:
            async def execute(arguments: Any, *, idempotency_key: str) -> Any:
                token = _idempotency_key.set(idempotency_key)
                try:
                    return to_jsonable_python(await invoke(tool_context, tool_input))
                finally:
                    _idempotency_key.reset(token)

            # Keyed by the call id: parallel tool calls finish in any order, but the ids come
            # from a (replayed) model response and are the same on every attempt.
            name = f"{TOOL_STEP}.{tool.name}.{tool_context.tool_call_id}"
            return await ctx.astep(name, execute, call_arguments(tool_input), idempotent=idempotent)

        return dataclasses.replace(tool, on_invoke_tool=journaled)

    def _handoff(self, target: Agent[Any] | Handoff[Any, Any]) -> Agent[Any] | Handoff[Any, Any]:
        if isinstance(target, Agent):
            # what the SDK makes of a listed agent; it runs no user code, so it may repeat
            clone = self.agent(target)
            return self._journaled_handoff(handoff(clone), clone, idempotent=True)
        ref = target._agent_ref() if target._agent_ref is not None else None
        if not isinstance(ref, Agent):  # a Handoff built by hand: its target is only known by
            return target  # calling it, so it is not journaled (see docs/agents.md)
        idempotent = target.tool_name in self.idempotent_tools
        return self._journaled_handoff(target, ref, idempotent=idempotent)

    def _journaled_handoff(
        self, target: Handoff[Any, Any], known_target: Agent[Any], *, idempotent: bool
    ) -> Handoff[Any, Any]:
        """``target`` (made by ``handoff()`` for ``known_target``), its call a journaled step."""
        invoke = target.on_invoke_handoff
        ctx = self.ctx

        async def journaled(context: RunContextWrapper[Any], input_json: str) -> Agent[Any]:
            async def transfer(call: Any) -> str:
                agent: Agent[Any] = await invoke(context, input_json)
                return agent.name

            name = f"{HANDOFF_STEP}.{target.tool_name}"
            # the target is part of the step's digest: a resume whose handoff now goes
            # elsewhere stops with EffectMismatchError instead of replaying the old one
            call = {"arguments": call_arguments(input_json), "to": known_target.name}
            transferred_to: str = await ctx.astep(name, transfer, call, idempotent=idempotent)
            logger.debug("handoff %s to %s", name, transferred_to)
            # handoff() always returns the agent it was made for, replayed or not
            return self.agent(known_target)

        return dataclasses.replace(target, on_invoke_handoff=journaled)


class JournaledSession(SessionABC):
    """A session whose reads and writes, made by a durable agent run, are journaled steps.

    The run reads its history once per turn and adds what each turn made; on resume the
    reads return what the first attempt read (the replayed model requests need that
    conversation, not one the first attempt already added to) and the adds that finished
    are not made again. An add a kill cut short is made again: :class:`RunSession` drops
    it by its idempotency key, other sessions may hold its items twice.
    """

    def __init__(self, session: Session, ctx: RunContext) -> None:
        self._session = session
        self._ctx = ctx
        self.session_id = session.session_id
        self.session_settings = getattr(session, "session_settings", None)

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The wrapped session's items, as the first attempt of the run read them."""

        async def read(limit: int | None) -> Any:
            return to_jsonable_python(await self._session.get_items(limit))

        items: list[TResponseInputItem] = await self._ctx.astep(
            f"{SESSION_STEP}.get_items", read, limit, idempotent=True
        )
        return items

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Add ``items`` to the wrapped session once per run."""
        session = self._session

        async def write(items: Any, *, idempotency_key: str) -> int:
            if isinstance(session, RunSession):
                await session.add_items(items, idempotency_key=idempotency_key)
            else:
                await session.add_items(items)
            return len(items)

        plain = to_jsonable_python(list(items))
        added: int = await self._ctx.astep(
            f"{SESSION_STEP}.add_items", write, plain, idempotent=True
        )
        logger.debug("session %s: %d items added", self.session_id, added)

    async def pop_item(self) -> TResponseInputItem | None:
        """Pop the wrapped session's newest item (in doubt if a kill cut it short)."""

        async def pop() -> Any:
            return to_jsonable_python(await self._session.pop_item())

        item: TResponseInputItem | None = await self._ctx.astep(
            f"{SESSION_STEP}.pop_item", pop, idempotent=False
        )
        return item

    async def clear_session(self) -> None:
        """Clear the wrapped session."""

        async def clear() -> bool:
            await self._session.clear_session()
            return True

        cleared: bool = await self._ctx.astep(
            f"{SESSION_STEP}.clear_session", clear, idempotent=True
        )
        logger.debug("session %s cleared: %s", self.session_id, cleared)
