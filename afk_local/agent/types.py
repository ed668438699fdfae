"""The data shapes of the agent runner: :class:`Agent`, :class:`Tool`, LLM responses, results.

Messages are plain dicts in the usual chat-completions shape (``role``:
``system``/``user``/``assistant``/``tool``; ``content``; an assistant's
``tool_calls`` as ``[{"id", "type": "function", "function": {"name",
"arguments"}}]`` with ``arguments`` a JSON string; a tool message's
``tool_call_id``), so they can be sent to an OpenAI-compatible API unchanged.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from afk_local.runner.code.entrypoints import is_entrypoint, name_in_module

LLMCallable = Callable[[list[dict[str, Any]], list[dict[str, Any]]], Any]
"""``llm(messages, tools) -> LLMResponse`` (or an awaitable of one)."""


class ToolCall(msgspec.Struct, kw_only=True, frozen=True):
    """One tool call the model asked for: ``id`` (stable per response), ``name``, ``arguments``."""

    id: str
    name: str
    arguments: dict[str, Any] = {}


class LLMResponse(msgspec.Struct, kw_only=True, frozen=True):
    """What an LLM callable returns for one step.

    Attributes:
        text: the assistant's text (the final answer when there are no tool calls).
        tool_calls: tool calls to execute before the next step.
        finish_reason: ``"stop"``, ``"tool_calls"``, ``"length"``...
        usage: token counts (``prompt_tokens``, ``completion_tokens``, ...); summed per run.
        model: the model that answered (the provider's normalized name).
        provider: who served it (``"openai"``, ``"scripted"``...).
        cost_usd: the call's cost, when known; summed into ``total_cost_usd``.
        structured: a parsed structured answer (becomes ``final_structured``).
        session_token: a provider session handle to continue with, if any.
        checkpoint_token: a provider-side checkpoint handle, if any.
    """

    text: str | None = None
    tool_calls: list[ToolCall] = []
    finish_reason: str | None = None
    usage: dict[str, int | float] = {}
    model: str | None = None
    provider: str | None = None
    cost_usd: float | None = None
    structured: Any = None
    session_token: str | None = None
    checkpoint_token: str | None = None


@dataclass(frozen=True)
class Tool:
    """A plain function the model may call.

    Args:
        fn: a sync or async function taking the tool's arguments as keywords.
        name: the name the model uses (default ``fn.__name__``).
        description: shown to the model (default: the docstring's first line).
        requires_approval: pause the run for a person's decision before each call.
        idempotent: safe to call twice: a call a crash left in doubt is retried
            (``False``: resume raises :class:`~afk_local.EffectInDoubtError`). None
            (the default): retried when ``fn`` takes an ``idempotency_key`` parameter
            (it gets the same key again, and the service drops the duplicate), else
            in doubt, as for ``ctx.step``.
        retries: extra attempts when the function raises, within one run attempt.
        parameters: a JSON schema of the arguments (default: from the signature).
    """

    fn: Callable[..., Any]
    name: str = ""
    description: str = ""
    requires_approval: bool = False
    idempotent: bool | None = None
    retries: int = 0
    parameters: dict[str, Any] | None = None

    def spec(self) -> dict[str, Any]:
        """The tool as handed to the LLM: ``{"name", "description", "parameters"}``."""
        return {
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters
            if self.parameters is not None
            else parameters_schema(self.fn),
        }


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    requires_approval: bool = False,
    idempotent: bool | None = None,
    retries: int = 0,
) -> Any:
    """Mark a function as a tool with options; use bare (``@tool``) or called (``@tool(...)``).

    Example:
        >>> @tool(requires_approval=True)
        ... def send_email(to: str, body: str) -> str:
        ...     '''Send an email.'''
        ...     return "sent"
        >>> send_email.requires_approval
        True
    """

    def make(func: Callable[..., Any]) -> Tool:
        return Tool(
            func,
            name=name or func.__name__,
            description=description if description is not None else _first_line(func),
            requires_approval=requires_approval,
            idempotent=idempotent,
            retries=retries,
        )

    return make(fn) if fn is not None else make


def as_tool(name: str, value: Callable[..., Any] | Tool) -> Tool:
    """Normalize one entry of ``Agent.tools`` to a :class:`Tool` named ``name``."""
    if isinstance(value, Tool):
        return value if value.name == name else _replace_name(value, name)
    if not callable(value):
        raise TypeError(
            f"tool {name!r} must be a function or afk_local.agent.types.Tool, not {value!r}"
        )
    return Tool(
        value,
        name=name,
        description=_first_line(value),
        requires_approval=bool(getattr(value, "requires_approval", False)),
        idempotent=_idempotent(getattr(value, "idempotent", None)),
    )


def _idempotent(value: Any) -> bool | None:
    """A function's ``idempotent`` attribute as a tool option (None: decided by its signature)."""
    return None if value is None else bool(value)


def _replace_name(value: Tool, name: str) -> Tool:
    return Tool(
        value.fn,
        name=name,
        description=value.description,
        requires_approval=value.requires_approval,
        idempotent=value.idempotent,
        retries=value.retries,
        parameters=value.parameters,
    )


def _first_line(fn: Callable[..., Any]) -> str:
    doc = inspect.getdoc(fn) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


_JSON_TYPES = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    list: "array",
    dict: "object",
}


def parameters_schema(fn: Callable[..., Any]) -> dict[str, Any]:
    """A small JSON schema of ``fn``'s keyword parameters (basic types; others unconstrained)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return {"type": "object", "properties": {}}
    properties: dict[str, Any] = {}
    required: list[str] = []
    for param in signature.parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if param.name == "idempotency_key":
            continue  # filled in by the journal, not by the model
        annotation = param.annotation
        if isinstance(annotation, str):
            kind = {"str": "string", "int": "integer", "float": "number", "bool": "boolean"}.get(
                annotation
            )
        else:
            kind = _JSON_TYPES.get(annotation)
        properties[param.name] = {"type": kind} if kind else {}
        if param.default is param.empty:
            required.append(param.name)
    return {"type": "object", "properties": properties, "required": required}


@dataclass
class Agent:
    """An LLM with tools, run by :class:`~afk_local.AgentRunner`.

    Args:
        name: the agent's name (recorded in ``run_started``).
        instructions: the system message.
        llm: ``llm(messages, tools) -> LLMResponse``, sync or async.
        tools: name -> function, :class:`Tool`, or another :class:`Agent` (a
            subagent: the model calls it with ``{"task": "..."}`` and it runs as a
            child run).
        model: the requested model name (recorded; the adapter may use it).
        provider: the provider name to record before the first response.
        max_steps: LLM calls per run before it fails.
        parallel_tools: run a step's tool calls concurrently (threads).
        parallel_subagents: run a step's subagent calls concurrently.
        llm_retries: extra LLM attempts when it raises, within one run attempt.
        retry_backoff_s: first pause between retries (doubles each time).
        tool_errors: ``"fail"`` (a tool that still raises after its retries ends
            the run ``failed``) or ``"report"`` (the error goes to the model as the
            tool's result).
        entrypoint: ``"module:qualname"`` from which another process (``afk-local
            resume``, the watcher) rebuilds this agent: a module-level ``Agent``, or
            a function returning one, called with no argument or with the run's
            ``context`` dict. Default: found by itself when the agent is a
            module-level object (see :meth:`find_entrypoint`).
    """

    name: str
    instructions: str | None
    llm: LLMCallable
    tools: Mapping[str, Any] = field(default_factory=dict)
    model: str | None = None
    provider: str | None = None
    max_steps: int = 50
    parallel_tools: bool = True
    parallel_subagents: bool = True
    llm_retries: int = 2
    retry_backoff_s: float = 0.5
    tool_errors: str = "fail"
    entrypoint: str | None = None
    _defined_in: str | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.tool_errors not in ("fail", "report"):
            raise ValueError("tool_errors must be 'fail' or 'report'")
        if self.max_steps < 1:
            raise ValueError("max_steps must be at least 1")
        if self.entrypoint is not None and not is_entrypoint(self.entrypoint):
            raise ValueError(
                f"Agent(entrypoint={self.entrypoint!r}): expected 'module:qualname' of a "
                "module-level Agent or of a function returning one (e.g. 'mypkg.agents:build')"
            )
        self._defined_in = _constructing_module()

    def find_entrypoint(self) -> str | None:
        """Where another process finds this agent: ``"module:qualname"``, or None.

        ``entrypoint`` when given; else the name this very object has at the top
        level of the module that constructed it (``"mypkg.agents:researcher"``;
        ``"__main__:..."`` for a script or a notebook, which only that process can
        use); else None (built inside a function: give it an ``entrypoint``).
        """
        if self.entrypoint is not None:
            return self.entrypoint
        return name_in_module(self, self._defined_in)

    def tool_table(self) -> dict[str, Tool | Agent]:
        """Name -> :class:`Tool` or subagent :class:`Agent`, validated."""
        table: dict[str, Tool | Agent] = {}
        for name, value in self.tools.items():
            table[name] = value if isinstance(value, Agent) else as_tool(name, value)
        return table

    def tool_specs(self) -> list[dict[str, Any]]:
        """What the LLM callable gets as ``tools``: ``[{"name", "description", "parameters"}]``."""
        specs = []
        for name, value in self.tool_table().items():
            if isinstance(value, Agent):
                specs.append(
                    {
                        "name": name,
                        "description": f"Hand a sub-task to the {value.name} agent.",
                        "parameters": {
                            "type": "object",
                            "properties": {"task": {"type": "string"}},
                            "required": ["task"],
                        },
                    }
                )
            else:
                specs.append(value.spec())
        return specs


def _constructing_module() -> str | None:
    """``__name__`` of the first caller outside this module (the dataclass __init__ is in it)."""
    frame = inspect.currentframe()
    while frame is not None:
        name = frame.f_globals.get("__name__")
        if name != __name__:
            return name if isinstance(name, str) else None
        frame = frame.f_back
    return None


class AgentResult(msgspec.Struct, kw_only=True):
    """How an agent run ended (or paused).

    Attributes:
        run_id: the run's id (pass it to :meth:`AgentRunner.resume`).
        thread_id: the conversation's thread id, if any.
        state: ``"completed"``, ``"failed"`` or ``"paused"``.
        final_text: the model's last answer (completed runs).
        final_structured: its structured answer, if the LLM gave one.
        usage: summed token counts.
        tool_executions: one record per tool or subagent call, in order.
        total_cost_usd: summed cost, when the LLM reported it.
        steps: LLM steps taken.
        llm_calls: LLM responses used (one per step).
        replayed_effect_count: journaled calls replayed instead of executed, over all attempts.
        error: the failure message (failed runs).
        pending: the pending request (paused runs): kind and tool call.
        messages: the conversation.
    """

    run_id: str
    thread_id: str | None = None
    state: str
    final_text: str | None = None
    final_structured: Any = None
    usage: dict[str, int | float] = {}
    tool_executions: list[dict[str, Any]] = []
    total_cost_usd: float | None = None
    steps: int = 0
    llm_calls: int = 0
    replayed_effect_count: int = 0
    error: str | None = None
    pending: dict[str, Any] | None = None
    messages: list[dict[str, Any]] = []


def assistant_message(response: LLMResponse) -> dict[str, Any]:
    """The chat message recording ``response`` (tool calls in the chat-completions shape)."""
    message: dict[str, Any] = {"role": "assistant", "content": response.text}
    if response.tool_calls:
        message["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
            }
            for call in response.tool_calls
        ]
    return message


__all__ = [
    "Agent",
    "AgentResult",
    "LLMCallable",
    "LLMResponse",
    "Tool",
    "ToolCall",
    "as_tool",
    "assistant_message",
    "parameters_schema",
    "tool",
]
