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
import dataclasses
import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

from pydantic_ai import (
    DeferredToolRequests,
    DeferredToolResults,
    ModelResponse,
    ModelRetry,
    ToolDenied,
)
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.capabilities.abstract import (
    ValidatedToolArgs,
    WrapModelRequestHandler,
    WrapToolExecuteHandler,
)
from pydantic_ai.exceptions import ToolRetryError
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    RetryPromptPart,
    SystemPromptPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.tools import RunContext as AgentRunContext
from pydantic_ai.tools import ToolDefinition
from pydantic_core import to_jsonable_python

from afk_local.integrations.agent_requests import (
    REQUEST_KEY,
    check_request,
    request_fingerprint,
    without_model,
)
from afk_local.runner.run.run_context import RunContext
from afk_local.runner.time.limits import Limit
from afk_local.runner.time.retry import Retry
from afk_local.storage.views.conversation import PYDANTIC_AI_MODEL_STEP as MODEL_STEP
from afk_local.storage.views.conversation import PYDANTIC_AI_TOOL_STEP as TOOL_STEP

__all__ = ["APPROVAL_PAUSE", "Journaled", "approval_results", "tool_idempotency_key"]

APPROVAL_PAUSE = "approval"

# A tool step's outcome when the tool raised ModelRetry: the message for the model.
_MODEL_RETRY = "afk_local.pydantic_ai.model_retry"

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


def _legacy_digest(messages: Sequence[ModelMessage]) -> str:
    """The digest afk_local journaled model steps with before request fingerprints.

    Kept so that runs recorded then stay replayable (:func:`check_request`'s ``legacy``).
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


def _legacy_digests(context: ModelRequestContext) -> list[str]:
    """The legacy digests this request may have been recorded with.

    pydantic-ai stamps ``model_id`` on the answers it asked for and not on those a
    replay hands back, so a step recorded in the attempt that asked is tried both ways.
    """
    messages = list(context.messages)
    model_id = context.model_id or getattr(context.model, "model_id", None)
    stamped = [
        dataclasses.replace(m, model_id=model_id)
        if isinstance(m, ModelResponse) and m.model_id is None
        else m
        for m in messages
    ]
    return [_legacy_digest(messages), _legacy_digest(stamped)]


def _as_sent(message: dict[str, Any]) -> dict[str, Any]:
    """What of a message (pydantic-ai's JSON form) is sent to the model.

    A request sends its parts and instructions; an answer in the history its parts.
    Timestamps, run ids, usage, the model's name and id, provider details and metadata
    are not sent, and a replayed answer does not carry all of them: left out.
    """
    parts = [{k: v for k, v in part.items() if k != "timestamp"} for part in message["parts"]]
    sent: dict[str, Any] = {"kind": message["kind"], "parts": parts}
    if message["kind"] == "request":
        sent["instructions"] = message.get("instructions")
    return sent


def _tool_spec(tool: ToolDefinition) -> dict[str, Any]:
    """What the model is told about a tool."""
    return {
        "description": tool.description,
        "parameters": tool.parameters_json_schema,
        "strict": tool.strict,
        "kind": tool.kind,
    }


def request_fingerprint_of(context: ModelRequestContext) -> dict[str, Any]:
    """The fingerprint (:func:`request_fingerprint`) of the request ``context`` is about to make."""
    messages = ModelMessagesTypeAdapter.dump_python(list(context.messages), mode="json")
    params = context.model_request_parameters
    tools = {tool.name: _tool_spec(tool) for tool in params.function_tools}
    output_tools = {tool.name: _tool_spec(tool) for tool in params.output_tools}
    output = {
        "mode": params.output_mode,
        "object": to_jsonable_python(params.output_object, fallback=repr),
        "tools": output_tools,
        "text": params.allow_text_output,
        "image": params.allow_image_output,
    }
    model = context.model
    name = f"{model.system}:{model.model_name}"
    return request_fingerprint([_as_sent(m) for m in messages], tools, output, name)


def _describe(messages: Sequence[ModelMessage]) -> Callable[[int], str]:
    """``describe(i)``: message ``i`` in a few words, for a mismatch."""

    def describe(index: int) -> str:
        message = messages[index]
        if isinstance(message, ModelResponse):
            calls = [p.tool_name for p in message.parts if isinstance(p, ToolCallPart)]
            if calls:
                return f"the model's answer calling {', '.join(calls)}"
            return f"the model's answer {_cut(message.text or '')!r}"
        said: list[str] = []
        for part in message.parts:
            if isinstance(part, UserPromptPart):
                said.append(f"the user prompt {_cut(str(part.content))!r}")
            elif isinstance(part, ToolReturnPart):
                said.append(f"the result of tool {part.tool_name!r}")
            elif isinstance(part, RetryPromptPart):
                said.append("a retry prompt")
            elif isinstance(part, SystemPromptPart):
                said.append(f"the system prompt {_cut(part.content)!r}")
        if message.instructions:
            said.append(f"the instructions {_cut(message.instructions)!r}")
        return " and ".join(said) or "a request"

    return describe


def _retry_text(error: ToolRetryError) -> str | None:
    """The message of the ``ModelRetry`` a tool raised (pydantic-ai hands it on wrapped)."""
    content = error.tool_retry.content
    return content if isinstance(content, str) else None


def _cut(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Journaled(AbstractCapability[Any]):
    """The capability that turns model requests and tool calls into steps of ``ctx``."""

    def __init__(
        self,
        ctx: RunContext,
        idempotent_tools: frozenset[str],
        *,
        model_retry: Retry | None = None,
        model_limit: Limit | None = None,
    ) -> None:
        self._ctx = ctx
        self._idempotent_tools = idempotent_tools
        self._model_step_options: dict[str, Any] = {}
        if model_retry is not None:
            self._model_step_options["retry"] = model_retry
        if model_limit is not None:
            self._model_step_options["limit"] = model_limit

    async def wrap_model_request(
        self,
        ctx: AgentRunContext[Any],
        *,
        request_context: ModelRequestContext,
        handler: WrapModelRequestHandler,
    ) -> ModelResponse:
        """Replay a journaled model response, or ask the model and journal its answer."""

        fingerprint = request_fingerprint_of(request_context)

        handled = False

        async def request(argument: Any) -> dict[str, Any]:
            nonlocal handled
            if not handled:
                handled = True
                response = await handler(request_context)
            else:  # a retry (model_retry=): pydantic-ai's handler may be called only once
                response = await request_context.model.request(
                    request_context.messages,
                    request_context.model_settings,
                    request_context.model_request_parameters,
                )
            # The request it answers is kept beside it so that `afk-local show` can tell
            # the conversation from the journal alone, and the fingerprint so that a
            # mismatch can say what differs; replay uses only the response.
            asked = request_context.messages[-1:]
            kept = [m for m in asked if isinstance(m, ModelRequest)]
            messages = ModelMessagesTypeAdapter.dump_json([*kept, response])
            return {"messages": messages, REQUEST_KEY: fingerprint}

        argument = check_request(
            self._ctx,
            MODEL_STEP,
            fingerprint,
            describe=_describe(request_context.messages),
            legacy=[without_model(fingerprint), *_legacy_digests(request_context)],
        )
        # A model request reads: when a crash cut it short, asking again is harmless.
        stored: Any = await self._ctx.astep(
            MODEL_STEP, request, argument, idempotent=True, **self._model_step_options
        )
        if isinstance(stored, dict):  # older runs stored the messages alone
            stored = stored["messages"]
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
            except (ModelRetry, ToolRetryError) as retry:
                # The tool's answer to the model ("try again, because..."), not a failure:
                # journaled as its outcome, so what the tool did before it is not repeated.
                message = retry.message if isinstance(retry, ModelRetry) else _retry_text(retry)
                if message is None:
                    raise
                return {_MODEL_RETRY: message}
            finally:
                _idempotency_key.reset(token)

        # Keyed by the call id: parallel tool calls finish in any order, but the ids
        # come from a (replayed) model response and are the same on every attempt.
        name = f"{TOOL_STEP}.{call.tool_name}.{call.tool_call_id}"
        idempotent = call.tool_name in self._idempotent_tools
        result = await self._ctx.astep(
            name, execute, to_jsonable_python(args), idempotent=idempotent
        )
        if isinstance(result, dict) and result.keys() == {_MODEL_RETRY}:
            raise ModelRetry(result[_MODEL_RETRY])
        return result
