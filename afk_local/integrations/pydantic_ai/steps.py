"""The journaled steps of a :class:`~afk_local.integrations.pydantic_ai.DurableAgent` run.

:class:`Journaled` is a pydantic-ai capability: it turns every model request and every
tool call of an agent run into one step of the durable job (``ctx.astep``). A model
step stores the request it answered (the newest ``ModelRequest``: the user prompt, tool
results, retry prompts) and the ``ModelResponse`` as pydantic-ai's own JSON
(``ModelMessagesTypeAdapter``); a tool step stores the tool's result as its JSON form
(``pydantic_core.to_jsonable_python``). Nothing is pickled. ``afk-local show`` reads the
conversation back from these steps (:mod:`afk_local.storage.views.conversation`).
"""

from __future__ import annotations

import contextvars
import hashlib
import json
from collections.abc import Sequence
from typing import Any

from pydantic_ai import DeferredToolRequests, DeferredToolResults, ModelResponse, ToolDenied
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.capabilities.abstract import (
    ValidatedToolArgs,
    WrapModelRequestHandler,
    WrapToolExecuteHandler,
)
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ToolCallPart,
)
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.tools import RunContext as AgentRunContext
from pydantic_ai.tools import ToolDefinition
from pydantic_core import to_jsonable_python

from afk_local.runner.run_context import RunContext
from afk_local.storage.views.conversation import PYDANTIC_AI_MODEL_STEP as MODEL_STEP
from afk_local.storage.views.conversation import PYDANTIC_AI_TOOL_STEP as TOOL_STEP

__all__ = ["APPROVAL_PAUSE", "Journaled", "approval_results", "tool_idempotency_key"]

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


def approval_results(requests: DeferredToolRequests, answer: Any) -> DeferredToolResults:
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


class Journaled(AbstractCapability[Any]):
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
            # The request it answers is kept beside it so that `afk-local show` can tell
            # the conversation from the journal alone; replay uses only the response.
            asked = request_context.messages[-1:]
            kept = [m for m in asked if isinstance(m, ModelRequest)]
            return ModelMessagesTypeAdapter.dump_json([*kept, response])

        digest = _request_digest(request_context.messages)
        # A model request reads: when a crash cut it short, asking again is harmless.
        stored: bytes = await self._ctx.astep(MODEL_STEP, request, digest, idempotent=True)
        response = ModelMessagesTypeAdapter.validate_json(stored)[-1]
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
