"""What decides an agent's next model call, and a replay that says in words what changed.

A model step of an agent integration is journaled with a *request fingerprint*: a short
digest of each message the call sends, one of each tool it offers (name, description,
argument schema), one of the output type it asks for, and the model's name. The journal compares the
fingerprint's hash on replay; the fingerprint itself is kept in the step's outcome, so
that a resume whose request differs can say which message, which tool, or the output
type (:class:`~afk_local.errors.AgentRequestMismatchError`) instead of printing hashes.

Each integration decides what goes into a message's digest: only what is sent to the
model, never what the framework stamps on an answer it received (a model id, a
timestamp, usage), which a replayed answer does not carry.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from pydantic_core import to_jsonable_python

from afk_local.errors import AgentRequestMismatchError
from afk_local.journal.replay import input_hash
from afk_local.runner.run.run_context import RunContext

__all__ = [
    "REQUEST_KEY",
    "check_request",
    "data_digest",
    "request_fingerprint",
    "without_model",
]

REQUEST_KEY = "request"
"""Where a model step's outcome keeps the fingerprint of the request it answered."""


def data_digest(value: Any) -> str:
    """A short digest (16 hex digits) of ``value``'s canonical JSON form."""
    plain = to_jsonable_python(value, fallback=repr)
    stable = json.dumps(plain, sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(stable.encode(), digest_size=8).hexdigest()


def request_fingerprint(
    messages: Iterable[Any], tools: Mapping[str, Any], output: Any, model: str | None = None
) -> dict[str, Any]:
    """The fingerprint of a model request: what decides the call, each part digested.

    Args:
        messages: each message as sent (plain data, nothing volatile in it).
        tools: tool name -> what the model is told about it (description, schema).
        output: what the model is asked to answer with (mode, schema), or None.
        model: the name of the model asked (``openai:gpt-4o``), kept as it is so that a
            mismatch can name both; None: not part of the fingerprint (as recorded
            before models were).
    """
    fingerprint: dict[str, Any] = {
        "messages": [data_digest(m) for m in messages],
        "tools": {name: data_digest(spec) for name, spec in sorted(tools.items())},
        "output": data_digest(output),
    }
    if model is not None:
        fingerprint["model"] = model
    return fingerprint


def without_model(fingerprint: dict[str, Any]) -> dict[str, Any]:
    """``fingerprint`` as recorded before the model's name was part of it (a legacy form
    :func:`check_request` accepts, so that those runs stay replayable)."""
    return {name: value for name, value in fingerprint.items() if name != "model"}


def check_request(
    ctx: RunContext,
    step: str,
    fingerprint: dict[str, Any],
    *,
    describe: Callable[[int], str],
    legacy: Sequence[Any] = (),
) -> Any:
    """The argument to journal the next ``step`` with; raise when it would replay another call.

    A step not recorded yet, or recorded with this fingerprint, takes ``fingerprint``. A
    step recorded by an older afk_local (before fingerprints) takes the one of ``legacy``
    (the arguments that afk_local used) it was recorded with, so old runs stay
    replayable.

    Args:
        ctx: the job's context; the step's key is looked up in its journal.
        step: the step's name (``pydantic-ai.model``).
        fingerprint: :func:`request_fingerprint` of the request made now.
        describe: ``describe(i)``: message ``i`` of the request, in a few words.
        legacy: older forms of the step's argument, tried when the fingerprint differs.

    Raises:
        AgentRequestMismatchError: the step was recorded for another request; its
            ``differences`` say what differs.
    """
    key = ctx.next_step_key(step)
    journal = ctx.effects
    state = journal.lookup(key)
    if state is None or not state.input_hash:
        return fingerprint
    for argument in (fingerprint, *legacy):
        if input_hash(step, (argument,), {}) == state.input_hash:
            return argument
    recorded = None
    outcome = state.outcome
    if outcome is not None and outcome.status == "ok" and isinstance(outcome.result, dict):
        recorded = outcome.result.get(REQUEST_KEY)
    raise AgentRequestMismatchError(
        ctx.run_id, key, differences(recorded, fingerprint, describe), str(journal.path)
    )


def differences(
    recorded: Any, current: dict[str, Any], describe: Callable[[int], str]
) -> list[str]:
    """What ``current`` sends that ``recorded`` did not, in words (empty when nothing shows)."""
    if not isinstance(recorded, dict):
        return [
            "its messages, tools or output type differ from those of the recorded call (this "
            "step was recorded without the details that would say which)"
        ]
    found = _message_differences(recorded.get("messages"), current["messages"], describe)
    found += _tool_differences(recorded.get("tools"), current["tools"])
    if recorded.get("output") != current["output"]:
        found.append("the output type (or its schema) is not the one recorded")
    then, now = recorded.get("model"), current.get("model")
    if then is not None and now is not None and then != now:
        found.append(f"the model is {now!r} now, {then!r} then")
    return found


def _message_differences(
    recorded: Any, current: list[str], describe: Callable[[int], str]
) -> list[str]:
    if not isinstance(recorded, list):
        return []
    for index, digest in enumerate(current):
        if index >= len(recorded):
            return [
                f"it sends {len(current)} messages where the recorded call sent "
                f"{len(recorded)}, the first new one {describe(index)}"
            ]
        if recorded[index] != digest:
            return [
                f"message {index + 1} of {len(current)}, {describe(index)}, is not the one "
                "the recorded call sent"
            ]
    if len(recorded) > len(current):
        return [f"it sends {len(current)} messages where the recorded call sent {len(recorded)}"]
    return []


def _tool_differences(recorded: Any, current: dict[str, str]) -> list[str]:
    if not isinstance(recorded, dict):
        return []
    found = [f"tool {name!r} is offered now, not then" for name in current.keys() - recorded]
    found += [f"tool {name!r} was offered then, not now" for name in recorded.keys() - current]
    found += [
        f"tool {name!r} has another description or argument schema"
        for name, digest in current.items()
        if name in recorded and recorded[name] != digest
    ]
    return found
