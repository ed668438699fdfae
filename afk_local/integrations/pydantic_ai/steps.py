"""Durable pydantic-ai agents on afk_local files (``pip install 'afk_local[pydantic-ai]'``).

:class:`DurableAgent` wraps a pydantic-ai agent the way pydantic-ai's own ``DBOSAgent`` and
``TemporalAgent`` do, with a run directory in place of a database or a server. Inside an
``@afk.durable`` job, every model request and every tool call of ``run``/``run_sync`` is one
journaled step of the job (``ctx.astep``): after a kill, the resumed job replays the model
responses and tool results it already has and continues from the first call that did not
finish. Model responses are stored with pydantic-ai's own ``ModelMessagesTypeAdapter`` (JSON),
tool results as their JSON form (``pydantic_core.to_jsonable_python``); nothing is pickled.

>>> agent = Agent(model, tools=[send_mail])  # doctest: +SKIP
>>> durable_agent = DurableAgent(agent, idempotent_tools={"send_mail"})  # doctest: +SKIP
>>> @afk.durable  # doctest: +SKIP
... def job(ctx: afk.RunContext, prompt: str) -> str:
...     return durable_agent.run_sync(ctx, prompt).output
"""

from __future__ import annotations

import contextvars
import hashlib
import json
from collections.abc import Iterable, Sequence
from typing import Any, Generic, TypeVar

from pydantic_ai import DeferredToolRequests, DeferredToolResults, ModelResponse, ToolDenied
from pydantic_ai.agent import AbstractAgent, AgentRunResult
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.capabilities.abstract import (
    ValidatedToolArgs,
    WrapModelRequestHandler,
    WrapToolExecuteHandler,
)
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ToolCallPart
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.tools import RunContext as AgentRunContext
from pydantic_ai.tools import ToolDefinition
from pydantic_core import to_jsonable_python

from afk_local.runner.run_context import RunContext

__all__ = ["DurableAgent", "tool_idempotency_key"]

DepsT = TypeVar("DepsT")
OutputT = TypeVar("OutputT")

MODEL_STEP = "pydantic-ai.model"
TOOL_STEP = "pydantic-ai.tool"
APPROVAL_PAUSE = "approval"

# Keys that differ between two runs of the same conversation (when a message was
# made, which run made it): left out of the digest that guards a replayed model call.
_VOLATILE_KEYS = frozenset({"timestamp", "run_id", "conversation_id", "provider_response_id"})

_idempotency_key: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "afk_local_pydantic_ai_idempotency_key", default=None
)


def tool_idempotency_key() -> str:
    """The idempotency key of the tool call running now, equal across attempts of the run.

    Call it inside a tool of a :class:`DurableAgent` and hand it to the outside service so
    that it drops a repeated call (a tool named in ``idempotent_tools`` is called again
    after a crash cut it short).

    Raises:
        RuntimeError: outside a tool call of a :class:`DurableAgent`.
    """
    key = _idempotency_key.get()
    if key is None:
        raise RuntimeError("tool_idempotency_key() is only known inside a DurableAgent's tool call")
    return key


def _approval_results(requests: DeferredToolRequests, answer: Any) -> DeferredToolResults:
    """Turn a person's answer to an approval pause into pydantic-ai's ``DeferredToolResults``.

    ``answer`` maps each tool call id waiting for approval to ``true`` (approved),
    ``false`` (denied) or a string (denied, with that message for the model).

    Raises:
        ValueError: the answer is not such a mapping or leaves a call unanswered.
    """
    waiting = [call.tool_call_id for call in requests.approvals]
    if not isinstance(answer, dict) or sorted(answer) != sorted(waiting):
        raise ValueError(
            f"an approval answer maps each of the tool call ids {waiting} to true, false "
            f"or a message saying why not, not {answer!r}"
        )
    approvals: dict[str, bool | ToolDenied] = {}
    for call_id, verdict in answer.items():
        if isinstance(verdict, bool):
            approvals[call_id] = verdict
        elif isinstance(verdict, str):
            approvals[call_id] = ToolDenied(verdict)
        else:
            raise ValueError(
                f"tool call {call_id!r}: answer true, false or a message, not {verdict!r}"
            )
    return DeferredToolResults(approvals=dict(approvals))


def _request_digest(messages: Sequence[ModelMessage]) -> str:
    """A digest of the conversation a model request sends, without its volatile fields.

    The journal compares it on replay: a resumed run whose conversation before a model
    call differs (the code, the prompt or a tool changed) stops with
    ``EffectMismatchError`` instead of being handed an answer to another question.
    """
    plain = ModelMessagesTypeAdapter.dump_python(list(messages), mode="json")
    stable = json.dumps(_without_volatile(plain), sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(stable.encode(), digest_size=16).hexdigest()


def _without_volatile(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_volatile(v) for k, v in value.items() if k not in _VOLATILE_KEYS}
    if isinstance(value, list):
        return [_without_volatile(v) for v in value]
    return value


class _Journaled(AbstractCapability[Any]):
    """The capability that turns model requests and tool calls into steps of ``ctx``."""

    def __init__(self, ctx: RunContext, idempotent_tools: frozenset[str]) -> None:
        self._ctx = ctx
        self._idempotent_tools = idempotent_tools

    async def wrap_model_request(
        self,
        ctx: AgentRunContext[Any],
        *,
        request_context: ModelRequestContext,
        handler: WrapModelRequestHandler,
    ) -> ModelResponse:
        """Replay a journaled model response, or ask the model and journal its answer."""

        async def request(digest: str) -> bytes:
            response = await handler(request_context)
            return ModelMessagesTypeAdapter.dump_json([response])

        digest = _request_digest(request_context.messages)
        # A model request reads: when a crash cut it short, asking again is harmless.
        stored: bytes = await self._ctx.astep(MODEL_STEP, request, digest, idempotent=True)
        (response,) = ModelMessagesTypeAdapter.validate_json(stored)
        if not isinstance(response, ModelResponse):  # only a corrupt journal gets here
            raise TypeError(f"journaled model step holds a {type(response).__name__}")
        return response

    async def wrap_tool_execute(
        self,
        ctx: AgentRunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: ValidatedToolArgs,
        handler: WrapToolExecuteHandler,
    ) -> Any:
        """Replay a journaled tool result, or run the tool once and journal its result."""

        async def execute(tool_args: Any, *, idempotency_key: str) -> Any:
            token = _idempotency_key.set(idempotency_key)
            try:
                return to_jsonable_python(await handler(args))
            finally:
                _idempotency_key.reset(token)

        # Keyed by the call id: parallel tool calls finish in any order, but the ids
        # come from a (replayed) model response and are the same on every attempt.
        name = f"{TOOL_STEP}.{call.tool_name}.{call.tool_call_id}"
        idempotent = call.tool_name in self._idempotent_tools
        return await self._ctx.astep(name, execute, to_jsonable_python(args), idempotent=idempotent)


class DurableAgent(Generic[DepsT, OutputT]):
    """A pydantic-ai agent whose runs inside an ``@afk.durable`` job survive a kill.

    Every model request is a journaled step (replayed on resume, asked again if a crash
    cut it short: a request is a read). Every tool call is a journaled step keyed by its
    tool call id: replayed when it finished; when a crash cut it short it is *in doubt*,
    and the resume stops with ``EffectInDoubtError`` unless the tool is named in
    ``idempotent_tools`` (then it is called again with the same
    :func:`tool_idempotency_key`).

    A run that ends with tool calls waiting for approval (tools with
    ``requires_approval=True``, ``DeferredToolRequests`` in the agent's output types)
    pauses the job (``ctx.pause``, kind ``"approval"``): answer it from any process with
    ``afk-local resume RUN --input '{"CALL_ID": true}'`` (``false``, or a message, denies
    the call) and the agent continues with those answers.

    Args:
        agent: the pydantic-ai agent to run; it is not changed.
        idempotent_tools: names of tools that may be called again after a crash.
        pause_for_approvals: False returns ``DeferredToolRequests`` to the caller instead.
    """

    def __init__(
        self,
        agent: AbstractAgent[DepsT, OutputT],
        *,
        idempotent_tools: Iterable[str] = (),
        pause_for_approvals: bool = True,
    ) -> None:
        self._agent = agent
        self._idempotent_tools = frozenset(idempotent_tools)
        self._pause_for_approvals = pause_for_approvals

    @property
    def wrapped(self) -> AbstractAgent[DepsT, OutputT]:
        """The pydantic-ai agent this wraps."""
        return self._agent

    async def run(
        self, ctx: RunContext, user_prompt: str | None = None, **kwargs: Any
    ) -> AgentRunResult[OutputT]:
        """``agent.run(user_prompt, **kwargs)`` with every model and tool call a step of ``ctx``.

        Tool calls waiting for approval pause the run (see the class docstring).
        """
        capabilities = [*(kwargs.pop("capabilities", None) or ()), self._capability(ctx)]
        result: AgentRunResult[OutputT] = await self._agent.run(
            user_prompt, capabilities=capabilities, **kwargs
        )
        while (answers := self._approvals(ctx, result)) is not None:
            result = await self._agent.run(
                None, capabilities=capabilities, **self._continuation(kwargs, result, answers)
            )
        return result

    def run_sync(
        self, ctx: RunContext, user_prompt: str | None = None, **kwargs: Any
    ) -> AgentRunResult[OutputT]:
        """``agent.run_sync(user_prompt, **kwargs)``, each model and tool call a step of ``ctx``.

        Tool calls waiting for approval pause the run (see the class docstring).
        """
        capabilities = [*(kwargs.pop("capabilities", None) or ()), self._capability(ctx)]
        result: AgentRunResult[OutputT] = self._agent.run_sync(
            user_prompt, capabilities=capabilities, **kwargs
        )
        while (answers := self._approvals(ctx, result)) is not None:
            result = self._agent.run_sync(
                None, capabilities=capabilities, **self._continuation(kwargs, result, answers)
            )
        return result

    def _approvals(
        self, ctx: RunContext, result: AgentRunResult[OutputT]
    ) -> DeferredToolResults | None:
        """Pause for the approvals a run ended with; None when it did not end that way."""
        requests = result.output
        if not (
            self._pause_for_approvals
            and isinstance(requests, DeferredToolRequests)
            and requests.approvals
            and not requests.calls  # results of external calls are the caller's to bring
        ):
            return None
        prompt = {
            "question": "approve these tool calls? answer {tool_call_id: true, false or "
            "a message saying why not}",
            "approvals": [
                {"tool_call_id": c.tool_call_id, "tool_name": c.tool_name, "args": c.args_as_dict()}
                for c in requests.approvals
            ],
        }
        while True:  # an answer that does not fit is journaled too: ask again, saying why
            answer = ctx.pause(prompt, kind=APPROVAL_PAUSE)
            try:
                return _approval_results(requests, answer)
            except ValueError as exc:
                prompt = {**prompt, "error": str(exc)}

    @staticmethod
    def _continuation(
        kwargs: dict[str, Any], result: AgentRunResult[OutputT], answers: DeferredToolResults
    ) -> dict[str, Any]:
        return {
            **kwargs,
            "message_history": result.all_messages(),
            "deferred_tool_results": answers,
        }

    def _capability(self, ctx: RunContext) -> _Journaled:
        if not isinstance(ctx, RunContext):
            raise TypeError(
                "DurableAgent.run takes the durable job's afk.RunContext first, "
                f"not {type(ctx).__name__}"
            )
        return _Journaled(ctx, self._idempotent_tools)
