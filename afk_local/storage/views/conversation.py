"""The conversation of an agent run, as ``afk-local show`` and ``inspect --conversation`` print it.

Two writers keep a conversation, each in its own stored form, and this module reads both
as plain data (JSON and msgpack decoded into dicts and lists; nothing is unpickled,
evaluated or imported, so pydantic-ai need not be installed to read one):

- an :class:`~afk_local.AgentRunner` run: the chat messages (``role``, ``content``,
  ``tool_calls``) of its newest ``runtime_state`` checkpoint;
- a pydantic-ai ``DurableAgent`` run (in a job or standalone): its journaled steps, in
  journal order. A model step (:data:`PYDANTIC_AI_MODEL_STEP`) holds the request it
  answered and the model's response as pydantic-ai's message JSON; a tool step
  (``pydantic-ai.tool.NAME.CALL_ID``) holds the tool's result;
- an OpenAI Agents SDK ``DurableRunner`` run (in a job or standalone): its journaled
  steps too. A model step (:data:`OPENAI_AGENTS_MODEL_STEP`) holds the response's output
  items (Responses API JSON) and, since this release, under ``"request"`` the
  instructions and the input items new since the previous call (older runs show the
  responses only); a tool step (``openai-agents.tool.NAME.CALL_ID``) the tool's result,
  a handoff step (``openai-agents.handoff.TOOL``) the agent it handed to;
- a ``RunSession`` conversation: the items of its newest ``conversation`` checkpoint.

Each entry is ``{"role", "text"}`` plus ``tool``/``tool_call_id`` where they apply; long
texts are cut to a bound (``truncated`` says by how much), and only the newest entries are
kept (``omitted`` counts the others).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from afk_local.errors import AfkLocalError
from afk_local.storage.format.records import SESSION_PAUSE_KIND, Phase

if TYPE_CHECKING:
    from afk_local.storage.rundir.read.reader import RunReader

PYDANTIC_AI_MODEL_STEP = "pydantic-ai.model"
"""The step name of a pydantic-ai ``DurableAgent``'s model requests."""
PYDANTIC_AI_TOOL_STEP = "pydantic-ai.tool"
"""The step name prefix of its tool calls (``pydantic-ai.tool.NAME.CALL_ID``)."""

OPENAI_AGENTS_MODEL_STEP = "openai-agents.model"
"""The step name of an Agents SDK ``DurableRunner``'s model calls."""
OPENAI_AGENTS_TOOL_STEP = "openai-agents.tool"
"""The step name prefix of its function tool calls (``openai-agents.tool.NAME.CALL_ID``)."""
OPENAI_AGENTS_HANDOFF_STEP = "openai-agents.handoff"
"""The step name prefix of its handoffs (``openai-agents.handoff.TOOL_NAME``)."""

MAX_STORED_MESSAGE_BYTES = 16 << 20
"""A model step's stored messages longer than this are not parsed (shown as too long)."""

_IN_DOUBT = "(in doubt: a kill cut this call short; it may or may not have happened)"


def conversation(
    reader: RunReader, *, max_chars: int = 2000, max_entries: int = 500
) -> dict[str, Any] | None:
    """The conversation of the run ``reader`` reads, or None when it is not an agent run.

    Raises:
        EffectLogCorruptionError: the run's journal is damaged (not just torn at its end).

    Returns ``{"source", "entries", "omitted", "truncated"}``: ``source`` is
    ``"pydantic-ai"``, ``"openai-agents"``, ``"openai-agents-session"`` or ``"agent"``;
    ``entries`` the newest ``max_entries`` entries in order, each text cut to
    ``max_chars``; ``omitted`` how many older entries were left out; ``truncated`` how
    many texts were cut.
    """
    steps = _journal_steps(reader)
    entries: list[dict[str, Any]] | None = None
    if any(step["name"].startswith(_PYDANTIC_AI) for step in steps.values()):
        entries, source = _pydantic_ai_entries(steps), "pydantic-ai"
    elif any(step["name"].startswith(_OPENAI_AGENTS) for step in steps.values()):
        entries, source = _openai_agents_entries(steps), "openai-agents"
    else:
        entries, source = _agent_runner_entries(reader), "agent"
        if entries is None:
            entries, source = _session_entries(reader), "openai-agents-session"
    if entries is None:
        return None
    omitted = max(0, len(entries) - max_entries)
    kept = entries[omitted:]
    truncated = 0
    for entry in kept:
        text = entry["text"]
        if len(text) > max_chars:
            entry["text"] = text[:max_chars]
            entry["truncated"] = len(text) - max_chars
            truncated += 1
    return {"source": source, "entries": kept, "omitted": omitted, "truncated": truncated}


def conversation_lines(found: dict[str, Any], *, width: int = 200) -> list[str]:
    """Human lines for :func:`conversation`'s result: ``role: text``, one line per entry."""
    lines = []
    if found["omitted"]:
        lines.append(f"({found['omitted']} earlier entries not shown)")
    for entry in found["entries"]:
        role = entry["role"]
        if entry.get("tool"):
            role = f"{role} {entry['tool']}"
        text = " ".join(entry["text"].split())
        cut = entry.get("truncated", 0)
        if len(text) > width:
            cut += len(text) - width
            text = text[: width - 3] + "..."
        more = f" [{cut} more chars]" if cut else ""
        lines.append(f"{role}: {text}{more}")
    return lines


# -- the journal of an agent run --------------------------------------------------------

_PYDANTIC_AI = "pydantic-ai."
_OPENAI_AGENTS = "openai-agents."


def _journal_steps(reader: RunReader) -> dict[str, dict[str, Any]]:
    """The run's pydantic-ai and Agents SDK steps: key -> ``{name, outcome}``, journal order."""
    if not reader.paths.journal.exists():
        return {}
    records = reader.effects()  # a damaged journal raises: the caller says it is unreadable
    steps: dict[str, dict[str, Any]] = {}
    for record in records:
        if record.kind == "intent":  # (outcomes carry only the key)
            if record.name.startswith((_PYDANTIC_AI, _OPENAI_AGENTS)):
                step = steps.setdefault(record.key, {"name": record.name, "outcome": None})
                step["outcome"] = None  # a newer attempt: only its outcome counts
        elif record.key in steps:
            steps[record.key]["outcome"] = record
    return steps


def _tool_result(name: str, prefix: str, outcome: Any) -> dict[str, Any]:
    """The entry of a tool step named ``PREFIX.NAME.CALL_ID`` (its result, error or doubt)."""
    tool, call_id = _tool_of(name, prefix)
    entry: dict[str, Any] = {"role": "tool_result", "tool": tool, "tool_call_id": call_id}
    if outcome is None:
        entry["text"] = _IN_DOUBT
    elif outcome.status != "ok":
        error = outcome.error
        entry["text"] = f"error: {error.type}: {error.message}" if error else "error"
    else:
        entry["text"] = _as_text(outcome.result)
    return entry


def _stored_json(stored: Any) -> tuple[Any, dict[str, Any] | None]:
    """A model step's stored JSON, parsed; or ``(None, an "unreadable" entry)``.

    A step holds the JSON itself, or (since model steps keep what decided the call
    beside it) a map whose ``"messages"`` is that JSON.
    """
    if isinstance(stored, dict):
        stored = stored.get("messages")
    if isinstance(stored, str):
        stored = stored.encode()
    if not isinstance(stored, bytes):
        return None, {"role": "unreadable", "text": f"a model step holds a {type(stored).__name__}"}
    if len(stored) > MAX_STORED_MESSAGE_BYTES:
        return None, {"role": "unreadable", "text": f"a model step of {len(stored)} bytes"}
    try:
        return json.loads(stored), None
    except ValueError as exc:
        return None, {"role": "unreadable", "text": f"a model step is not JSON: {exc}"}


# -- pydantic-ai: the journal ---------------------------------------------------------


def _pydantic_ai_entries(steps: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The entries of a DurableAgent run's steps."""
    entries: list[dict[str, Any]] = []
    answered: set[str] = set()  # tool call ids whose result a tool step already showed
    instructions: list[str] = []  # the instructions shown last (each request carries them)
    for step in steps.values():
        outcome, name = step["outcome"], step["name"]
        if name == PYDANTIC_AI_MODEL_STEP:
            if outcome is None or outcome.status != "ok":
                continue  # a request a kill cut short is asked again: nothing to show
            entries.extend(_model_step_entries(outcome.result, answered, instructions))
        elif name.startswith(PYDANTIC_AI_TOOL_STEP + "."):
            entry = _tool_result(name, PYDANTIC_AI_TOOL_STEP, outcome)
            answered.add(entry["tool_call_id"])
            entries.append(entry)
    return entries


def _tool_of(name: str, prefix: str) -> tuple[str, str]:
    """``(tool name, tool call id)`` of a step named ``PREFIX.NAME.CALL_ID``.

    Tool names have no dots (both frameworks require identifiers), call ids may have them.
    """
    rest = name[len(prefix) + 1 :]
    tool, _, call_id = rest.partition(".")
    return tool, call_id


def _model_step_entries(
    stored: Any, answered: set[str], instructions: list[str]
) -> list[dict[str, Any]]:
    """Entries of one model step: the request it answered, then the response.

    A request's instructions are shown when they differ from the last ones shown.
    """
    messages, unreadable = _stored_json(stored)
    if unreadable is not None:
        return [unreadable]
    entries: list[dict[str, Any]] = []
    for message in messages if isinstance(messages, list) else []:
        told = message.get("instructions") if isinstance(message, dict) else None
        if isinstance(told, str) and told and told not in instructions[-1:]:
            instructions.append(told)
            entries.append({"role": "instructions", "text": told})
        parts = message.get("parts") if isinstance(message, dict) else None
        for part in parts if isinstance(parts, list) else []:
            if isinstance(part, dict):
                entry = _part_entry(part, answered)
                if entry is not None:
                    entries.append(entry)
    return entries


def _part_entry(part: dict[str, Any], answered: set[str]) -> dict[str, Any] | None:
    """One message part of pydantic-ai's JSON (``part_kind``) as an entry."""
    kind = part.get("part_kind")
    content = part.get("content")
    if kind == "user-prompt":
        return {"role": "user", "text": _as_text(content)}
    if kind == "system-prompt":
        return {"role": "system", "text": _as_text(content)}
    if kind == "text":
        return {"role": "assistant", "text": _as_text(content)}
    if kind == "thinking":
        return {"role": "thinking", "text": _as_text(content)}
    if kind in ("tool-call", "builtin-tool-call"):
        return {
            "role": "tool_call",
            "tool": str(part.get("tool_name", "")),
            "tool_call_id": str(part.get("tool_call_id", "")),
            "text": _as_text(part.get("args")),
        }
    if kind in ("tool-return", "builtin-tool-return"):
        call_id = str(part.get("tool_call_id", ""))
        if call_id in answered:
            return None  # its tool step was shown where it ran
        return {
            "role": "tool_result",
            "tool": str(part.get("tool_name", "")),
            "tool_call_id": call_id,
            "text": _as_text(content),
        }
    if kind == "retry-prompt":
        entry = {"role": "retry", "text": _as_text(content)}
        if part.get("tool_name"):
            entry["tool"] = str(part["tool_name"])
        return entry
    return {"role": str(kind or "part"), "text": _as_text(content)}


# -- the OpenAI Agents SDK: the journal, a RunSession's items -------------------------


class _ItemReader:
    """Responses API items (plain JSON) as entries; remembers what it showed to not repeat it.

    A model call's input repeats the previous calls' output items (their ``id``) and
    the tool calls whose results a tool step already showed (their ``call_id``).
    """

    def __init__(self) -> None:
        self.shown_ids: set[str] = set()  # ids, call ids, JSON of the items shown
        self.answered: set[str] = set()  # call ids whose result a tool step showed
        self.tools: dict[str, str] = {}  # call id -> tool name
        self.handoff_tools: set[str] = set()  # tool names of the handoffs shown
        self.instructions: list[str] = []

    def items(self, items: Any, *, repeated: bool) -> list[dict[str, Any]]:
        """Entries of ``items``; with ``repeated``, those already shown are left out."""
        entries = []
        for item in items if isinstance(items, list) else []:
            if not isinstance(item, dict):
                continue
            seen = self._seen_as(item)
            if repeated and {*seen, _json_key(item)} & self.shown_ids:
                continue
            # an output item's JSON too (a request repeats it, perhaps without an id); not
            # an input item's: a user may send the same words twice
            self.shown_ids |= seen if repeated else {*seen, _json_key(item)}
            entry = self.item(item)
            if entry is not None:
                entries.append(entry)
        return entries

    @staticmethod
    def _seen_as(item: dict[str, Any]) -> set[str]:
        """What tells ``item`` again when a later request repeats it (ids may be missing)."""
        seen: set[str] = set()
        if isinstance(item.get("id"), str):
            seen.add("id:" + item["id"])
        if item.get("type") == "function_call" and isinstance(item.get("call_id"), str):
            seen.add("call:" + item["call_id"])
        return seen

    def item(self, item: dict[str, Any]) -> dict[str, Any] | None:
        """One input or output item as an entry (None: nothing new to show)."""
        kind = item.get("type")
        if kind == "function_call":
            call_id, name = str(item.get("call_id", "")), str(item.get("name", ""))
            self.tools[call_id] = name
            return {
                "role": "tool_call",
                "tool": name,
                "tool_call_id": call_id,
                "text": _as_text(item.get("arguments")),
            }
        if kind == "function_call_output":
            call_id = str(item.get("call_id", ""))
            tool = self.tools.get(call_id, "")
            if call_id in self.answered or tool in self.handoff_tools:
                return None  # its tool (or handoff) step was shown where it ran
            return {
                "role": "tool_result",
                "tool": tool,
                "tool_call_id": call_id,
                "text": _as_text(item.get("output")),
            }
        if kind == "reasoning":
            summary = item.get("summary")
            texts = [p.get("text") for p in summary if isinstance(p, dict)] if summary else []
            text = "\n".join(t for t in texts if isinstance(t, str))
            return {"role": "thinking", "text": text} if text else None
        if "role" in item and kind in (None, "message"):
            return {"role": str(item["role"]), "text": _content_text(item.get("content"))}
        return {"role": str(kind or "item"), "text": _as_text(item)}


def _json_key(item: dict[str, Any]) -> str:
    return "json:" + json.dumps(item, sort_keys=True, default=repr)


def _content_text(content: Any) -> str:
    """A message's content: its text, or its parts' texts (``[input_image]`` for others)."""
    if isinstance(content, str):
        return content
    texts = []
    for part in content if isinstance(content, list) else []:
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif isinstance(part, dict) and isinstance(part.get("refusal"), str):
            texts.append(f"(refused) {part['refusal']}")
        elif isinstance(part, dict):
            texts.append(f"[{part.get('type', 'part')}]")
    return "\n".join(texts)


def _openai_agents_entries(steps: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The entries of a DurableRunner run's steps."""
    entries: list[dict[str, Any]] = []
    reader = _ItemReader()
    for step in steps.values():
        outcome, name = step["outcome"], step["name"]
        if name == OPENAI_AGENTS_MODEL_STEP:
            if outcome is None or outcome.status != "ok":
                continue  # a call a kill cut short is asked again: nothing to show
            stored, unreadable = _stored_json(outcome.result)
            if unreadable is not None or not isinstance(stored, dict):
                entries.append(unreadable or {"role": "unreadable", "text": "not a response"})
                continue
            request = stored.get("request")
            if isinstance(request, dict):  # older runs kept the response only
                told = request.get("instructions")
                if isinstance(told, str) and told and told not in reader.instructions[-1:]:
                    reader.instructions.append(told)
                    entries.append({"role": "instructions", "text": told})
                entries.extend(reader.items(request.get("input"), repeated=True))
            entries.extend(reader.items(stored.get("output"), repeated=False))
        elif name.startswith(OPENAI_AGENTS_TOOL_STEP + "."):
            entry = _tool_result(name, OPENAI_AGENTS_TOOL_STEP, outcome)
            reader.answered.add(entry["tool_call_id"])
            entries.append(entry)
        elif name.startswith(OPENAI_AGENTS_HANDOFF_STEP + "."):
            tool = name[len(OPENAI_AGENTS_HANDOFF_STEP) + 1 :]
            reader.handoff_tools.add(tool)
            if outcome is None:
                text = _IN_DOUBT
            elif outcome.status != "ok":
                text = f"error: {outcome.error.type}" if outcome.error else "error"
            else:
                text = f"to {_as_text(outcome.result)}"
            entries.append({"role": "handoff", "tool": tool, "text": text})
    return entries


def _session_entries(reader: RunReader) -> list[dict[str, Any]] | None:
    """The history of a ``RunSession`` run (its newest checkpoint); None when it is not one."""
    latest = None
    for file in reversed(reader.checkpoint_files()):
        if file.phase == Phase.PAUSED.value:
            try:
                latest = reader.load(file).payload
            except AfkLocalError:
                continue
            break
    if not isinstance(latest, dict) or latest.get("kind") != SESSION_PAUSE_KIND:
        return None
    items = latest.get("items")
    if not isinstance(items, list):
        return None
    return _ItemReader().items(items, repeated=False)


# -- AgentRunner: the newest runtime_state ---------------------------------------------


def _agent_runner_entries(reader: RunReader) -> list[dict[str, Any]] | None:
    """The entries of an AgentRunner run's newest snapshot; None when it has none."""
    if reader.meta.extra.get("kind") != "agent":
        return None
    payload = None
    for file in reversed(reader.checkpoint_files()):
        if file.phase == Phase.RUNTIME_STATE.value:
            try:
                payload = reader.load(file).payload
            except AfkLocalError:
                continue
            break
    messages = payload.get("messages") if isinstance(payload, dict) else None
    if not isinstance(messages, list):
        return None
    entries: list[dict[str, Any]] = []
    tools: dict[str, str] = {}
    for message in messages:
        if not isinstance(message, dict):
            continue
        role = str(message.get("role", ""))
        content = message.get("content")
        if role == "tool":
            call_id = str(message.get("tool_call_id", ""))
            entries.append(
                {
                    "role": "tool_result",
                    "tool": tools.get(call_id, ""),
                    "tool_call_id": call_id,
                    "text": _as_text(content),
                }
            )
            continue
        if content not in (None, ""):
            entries.append({"role": role, "text": _as_text(content)})
        calls = message.get("tool_calls")
        for call in calls if isinstance(calls, list) else []:
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict):
                continue
            call_id, name = str(call.get("id", "")), str(function.get("name", ""))
            tools[call_id] = name
            entries.append(
                {
                    "role": "tool_call",
                    "tool": name,
                    "tool_call_id": call_id,
                    "text": _as_text(function.get("arguments")),
                }
            )
    return entries


def _as_text(value: Any) -> str:
    """A part's content as text: strings as they are, anything else as compact JSON."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=repr)
    except ValueError:
        return repr(value)


__all__ = [
    "MAX_STORED_MESSAGE_BYTES",
    "OPENAI_AGENTS_HANDOFF_STEP",
    "OPENAI_AGENTS_MODEL_STEP",
    "OPENAI_AGENTS_TOOL_STEP",
    "PYDANTIC_AI_MODEL_STEP",
    "PYDANTIC_AI_TOOL_STEP",
    "SESSION_PAUSE_KIND",
    "conversation",
    "conversation_lines",
]
