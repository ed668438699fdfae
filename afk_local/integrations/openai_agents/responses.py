"""Model responses of the Agents SDK as journal data: JSON through the SDK's own models.

A response's output items go through the Responses API's pydantic models (the union the
SDK calls ``TResponseOutputItem``), its usage through the SDK's usage serializer; loading
validates both, so a damaged journal is an error, never a half-read object. Nothing is
pickled.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

from agents import Handoff
from agents.items import ModelResponse, TResponseOutputItem
from agents.tool import Tool
from agents.usage import deserialize_usage, serialize_usage
from pydantic import TypeAdapter
from pydantic_core import to_jsonable_python

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


def call_arguments(tool_input: str) -> Any:
    """A tool call's JSON arguments as data (part of the step's digest); the text if not JSON."""
    try:
        return json.loads(tool_input) if tool_input else None
    except json.JSONDecodeError:
        return tool_input
