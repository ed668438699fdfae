"""Model responses of the Agents SDK as journal data: JSON through the SDK's own models.

A response's output items go through the Responses API's pydantic models (the union the
SDK calls ``TResponseOutputItem``), its usage through the SDK's usage serializer; loading
validates both, so a damaged journal is an error, never a half-read object. Nothing is
pickled.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from typing import Any

from agents import Handoff
from agents.items import ModelResponse, TResponseOutputItem
from agents.tool import FunctionTool, Tool
from agents.usage import deserialize_usage, serialize_usage
from pydantic import TypeAdapter
from pydantic_core import to_jsonable_python

from afk_local.integrations.agent_requests import request_fingerprint

_OUTPUT_ITEMS: TypeAdapter[list[TResponseOutputItem]] = TypeAdapter(list[TResponseOutputItem])


def dump_response(response: ModelResponse, request: dict[str, Any] | None = None) -> bytes:
    """A model response as JSON: output items through their pydantic models, usage as the SDK's.

    ``request`` (plain data: the instructions and the input items new since the previous
    call) is kept beside it under ``"request"`` for ``afk-local show``; loading ignores it.
    """
    plain: dict[str, Any] = {
        "output": _OUTPUT_ITEMS.dump_python(list(response.output), mode="json", by_alias=True),
        "usage": serialize_usage(response.usage),
        "response_id": response.response_id,
        "request_id": response.request_id,
    }
    if request is not None:
        plain["request"] = request
    return json.dumps(plain, separators=(",", ":")).encode()


def load_response(stored: bytes) -> ModelResponse:
    """The :class:`ModelResponse` that :func:`dump_response` stored, validated on the way in.

    Raises:
        ValueError: the stored value is not such a response (a damaged or foreign journal).
    """
    plain = json.loads(stored)
    if not isinstance(plain, dict) or not isinstance(plain.get("usage"), dict):
        raise ValueError(f"a journaled model step holds no model response: {stored[:80]!r}")
    return ModelResponse(
        output=_OUTPUT_ITEMS.validate_python(plain.get("output")),
        usage=deserialize_usage(plain["usage"]),
        response_id=plain.get("response_id"),
        request_id=plain.get("request_id"),
    )


def request_digest(
    system_instructions: str | None,
    input: Any,
    tools: Iterable[Tool],
    handoffs: Iterable[Handoff[Any, Any]],
) -> str:
    """A digest of what a model call sends: instructions, conversation, tool and handoff names.

    The journal compares it on replay: a resumed run whose request differs (the prompt,
    instructions, a tool or the code changed) stops with ``EffectMismatchError`` instead of
    being handed an answer to another question.
    """
    plain = {
        "instructions": system_instructions,
        "input": to_jsonable_python(input, fallback=repr),
        "tools": sorted(tool.name for tool in tools),
        "handoffs": sorted(handoff.tool_name for handoff in handoffs),
    }
    stable = json.dumps(plain, sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(stable.encode(), digest_size=16).hexdigest()


def request_fingerprint_of(
    named: dict[str, Any], model: str | None = None
) -> tuple[dict[str, Any], Callable[[int], str]]:
    """What decides a model call (``Model.get_response``'s arguments by name), and a way to
    say what message ``i`` of it is: the instructions first, then each input item as sent;
    each tool (description, argument schema), each handoff (its target, its schema), the
    output schema and the ``model``'s name."""
    items = named.get("input")
    listed = [{"role": "user", "content": items}] if isinstance(items, str) else list(items or ())
    messages = [{"instructions": named.get("system_instructions")}]
    messages += [to_jsonable_python(item, fallback=repr) for item in listed]
    tools: dict[str, Any] = {}
    for tool in named.get("tools") or ():
        spec: dict[str, Any] = {"type": type(tool).__name__}
        if isinstance(tool, FunctionTool):
            spec.update(
                description=tool.description,
                parameters=tool.params_json_schema,
                strict=tool.strict_json_schema,
            )
        tools[tool.name] = spec
    for target in named.get("handoffs") or ():
        tools[target.tool_name] = {
            "handoff": target.agent_name,
            "description": target.tool_description,
            "parameters": target.input_json_schema,
        }
    schema = named.get("output_schema")
    output = None if schema is None else {"type": schema.name(), "schema": schema.json_schema()}

    def describe(index: int) -> str:
        if index == 0:
            return f"the instructions {_cut(str(named.get('system_instructions')))!r}"
        item = messages[index]
        kind = item.get("type") if isinstance(item, dict) else None
        if isinstance(item, dict) and item.get("role") == "user":
            return f"the user input {_cut(str(item.get('content')))!r}"
        if kind == "function_call":
            return f"the model's call of tool {item.get('name')!r}"
        if kind == "function_call_output":
            return f"the result of call {item.get('call_id')!r}"
        return f"an input item of type {kind or type(item).__name__}"

    return request_fingerprint(messages, tools, output, model), describe


def model_name(model: Any) -> str:
    """The name of an Agents SDK ``Model`` for a fingerprint: the model it asks
    (``OpenAIResponsesModel.model``, ``"gpt-4o"``), else its class's name."""
    name = getattr(model, "model", None)
    return name if isinstance(name, str) else type(model).__name__


def _cut(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def call_arguments(tool_input: str) -> Any:
    """A tool call's JSON arguments as data (part of the step's digest); the text if not JSON."""
    try:
        return json.loads(tool_input) if tool_input else None
    except json.JSONDecodeError:
        return tool_input
