"""One ``Runner.run`` inside a durable job: every model call, tool call and handoff a step of it.

What :class:`~afk_local.integrations.openai_agents.DurableRunner` runs, whether it found
the job's ``ctx`` (drop-in form), was given it, or made a standalone run of its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from agents import Agent, RunConfig, Runner, RunResult
from agents.items import ToolApprovalItem
from agents.memory import OpenAIConversationsSession
from agents.run_state import RunState

from afk_local.integrations.openai_agents.journaled import JournaledSession, Wrapping
from afk_local.integrations.openai_agents.responses import call_arguments
from afk_local.runner.run.run_context import RunContext
from afk_local.runner.time.limits import Limit
from afk_local.runner.time.retry import Retry

APPROVAL_PAUSE = "approval"


async def run_in_job(
    ctx: RunContext,
    starting_agent: Agent[Any],
    input: str | list[Any],
    *,
    idempotent_tools: Iterable[str] = (),
    pause_for_approvals: bool = True,
    model_retry: Retry | None = None,
    model_limit: Limit | None = None,
    **kwargs: Any,
) -> RunResult:
    """``Runner.run(starting_agent, input, **kwargs)`` with every call a step of ``ctx``.

    Args:
        ctx: the durable job's context.
        starting_agent: the agent to run; it is not changed (a journaled clone runs).
        input: the user input, as for ``Runner.run``.
        idempotent_tools: names of tools (and handoff tools) that may be called again
            after a crash.
        pause_for_approvals: False returns a result with ``interruptions`` to the caller.
        model_retry: an ``afk.Retry`` for each model call (each failed try journaled, the
            backoff a durable sleep).
        model_limit: an ``afk.Limit`` each model call waits for a place under.
        **kwargs: the other arguments of ``Runner.run`` (``context``, ``max_turns``,
            ``hooks``, ``run_config``, ``session``, ...).
    """
    wrap = _wrapping(ctx, idempotent_tools, model_retry, model_limit)
    agent = wrap.agent(starting_agent)
    run_config, owned = _run_config(kwargs.get("run_config"))
    kwargs["run_config"] = wrap.run_config(run_config)
    session = kwargs.get("session")
    if session is not None and not isinstance(session, OpenAIConversationsSession):
        # a server-side conversation is the SDK's to track: left as it is
        kwargs["session"] = JournaledSession(session, ctx)
    try:
        result = await Runner.run(agent, input, **kwargs)
        while pause_for_approvals and result.interruptions:
            state = result.to_state()
            _answer_approvals(ctx, state, list(result.interruptions))
            result = await Runner.run(agent, state, **_continuation(kwargs))
    finally:
        # the SDK waits only a moment for a tool call it cancelled (a sibling failed):
        # each call's outcome is journaled as it ends, before this loop can end
        await ctx.wait_for_steps()
        if owned:  # the Runner closes a provider it made; this one is ours to close
            await run_config.model_provider.aclose()
    return result


def _wrapping(
    ctx: RunContext,
    idempotent_tools: Iterable[str],
    model_retry: Retry | None,
    model_limit: Limit | None,
) -> Wrapping:
    if not isinstance(ctx, RunContext):
        raise TypeError(
            "DurableRunner.run takes the durable job's afk.RunContext first, "
            f"not {type(ctx).__name__}"
        )
    return Wrapping(
        ctx, frozenset(idempotent_tools), model_retry=model_retry, model_limit=model_limit
    )


def _run_config(value: RunConfig | dict[str, Any] | None) -> tuple[RunConfig, bool]:
    """The run's config, and whether its model provider was made here (not the caller's)."""
    if value is None:
        return RunConfig(), True
    if isinstance(value, dict):
        return RunConfig(**value), "model_provider" not in value
    return value, False


def _continuation(kwargs: dict[str, Any]) -> dict[str, Any]:
    # The state carries the conversation and the session items were saved on the first
    # call; the SDK refuses a RunState together with these.
    dropped = {"previous_response_id", "conversation_id", "auto_previous_response_id"}
    return {k: v for k, v in kwargs.items() if k not in dropped}


def _answer_approvals(
    ctx: RunContext, state: RunState[Any], interruptions: list[ToolApprovalItem]
) -> None:
    """Pause until a person answers the waiting calls; apply the answer to ``state``."""
    prompt = _approval_prompt(interruptions)
    while True:  # an answer that does not fit is journaled too: ask again, saying why
        answer = ctx.pause(prompt, kind=APPROVAL_PAUSE)
        try:
            _apply_answer(state, interruptions, answer)
            return
        except ValueError as exc:
            prompt = {**prompt, "error": str(exc)}


def _approval_prompt(interruptions: list[ToolApprovalItem]) -> dict[str, Any]:
    return {
        "question": "approve these tool calls? answer {call_id: true, false or a message "
        "saying why not}",
        "approvals": [
            {
                "call_id": _call_id(item),
                "tool_name": item.tool_name,
                "arguments": call_arguments(item.arguments or ""),
            }
            for item in interruptions
        ],
    }


def _call_id(item: ToolApprovalItem) -> str:
    raw = item.raw_item
    call_id = raw.get("call_id") if isinstance(raw, dict) else getattr(raw, "call_id", None)
    return str(call_id if call_id is not None else getattr(raw, "id", ""))


def _apply_answer(state: RunState[Any], interruptions: list[ToolApprovalItem], answer: Any) -> None:
    """Approve or reject each waiting call on ``state`` as a person's answer says.

    ``answer`` maps each call id waiting for approval to ``true`` (approved), ``false``
    (rejected) or a string (rejected, with that message for the model).

    Raises:
        ValueError: the answer is not such a mapping or leaves a call unanswered.
    """
    waiting = {_call_id(item): item for item in interruptions}
    if not isinstance(answer, dict) or sorted(answer) != sorted(waiting):
        raise ValueError(
            f"an approval answer maps each of the call ids {sorted(waiting)} to true, false "
            f"or a message saying why not, not {answer!r}"
        )
    for call_id, verdict in answer.items():
        if not isinstance(verdict, (bool, str)):
            raise ValueError(f"call {call_id!r}: answer true, false or a message, not {verdict!r}")
    for call_id, verdict in answer.items():
        if verdict is True:
            state.approve(waiting[call_id])
        elif verdict is False:
            state.reject(waiting[call_id])
        else:
            state.reject(waiting[call_id], rejection_message=verdict)
