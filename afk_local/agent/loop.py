"""One attempt of an agent run: the step state machine of the phase protocol (docs/agent.md).

:class:`AgentLoop` takes a restored :class:`~afk_local.agent.state.Snapshot` and
steps until a final answer, a pause or a failure, writing every phase
checkpoint and routing the LLM call and every tool call through the journal.
:class:`~afk_local.AgentRunner` (:mod:`~afk_local.agent.agent_runner`) opens runs and
attempts around it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import msgspec

from afk_local.agent.state import STAGE_POST_LLM, STAGE_POST_TOOLS, STAGE_STEP_STARTED, Snapshot
from afk_local.agent.tools import (
    JOURNAL_ERRORS,
    CallOutcome,
    ToolExecutor,
    ToolFailedError,
    call_keys,
    call_maybe_async,
    run_batch,
)
from afk_local.agent.types import (
    Agent,
    AgentResult,
    LLMResponse,
    Tool,
    ToolCall,
    assistant_message,
)
from afk_local.errors import LLMFailedError, MaxStepsError
from afk_local.runner.run.stopping import defer_stop
from afk_local.runner.writer import DurableWriter
from afk_local.storage.format.records import Phase

log = logging.getLogger("afk_local")

NO_INPUT: Any = object()
"""Sentinel: no resume input was given."""
APPROVAL = "approval"


def decision(value: Any) -> tuple[bool, str | None]:
    """``(approved, reason)`` from a resume input: ``True``/``False``, or ``{"decision": ...}``."""
    reason = None
    if isinstance(value, dict):
        reason = value.get("reason")
        value = value.get("decision", value.get("approved"))
    if isinstance(value, str):
        return value.strip().lower() in ("approve", "approved", "yes", "y", "allow", "true"), reason
    return bool(value), reason if isinstance(reason, str) else None


class AgentLoop:
    """The state machine of one attempt: steps until a final answer, a pause or a failure."""

    def __init__(
        self,
        agent: Agent,
        writer: DurableWriter,
        snap: Snapshot,
        value: Any,
        *,
        in_doubt: Any,
        start_child: Callable[[Agent, str, str, str], dict[str, Any]],
    ) -> None:
        self.start_child = start_child
        self.agent = agent
        self.writer = writer
        self.snap = snap
        self.input = value
        self.run_id = writer.run_id
        self.thread_id = writer.run.meta.thread_id
        self.table = agent.tool_table()
        self.specs = agent.tool_specs()
        self.tools = ToolExecutor(
            writer.effects, self.run_id, in_doubt=in_doubt, backoff_s=agent.retry_backoff_s
        )
        if snap.requested_model is None:
            snap.requested_model = agent.model

    def checkpoint(self, phase: Phase, payload: dict[str, Any]) -> None:
        """Write a light phase checkpoint at the current step."""
        self.writer.checkpoint(phase, payload, step=self.snap.step)

    def snapshot(self, stage: str) -> None:
        """Write the full ``runtime_state`` snapshot, taken at ``stage``."""
        self.snap.stage = stage
        self.writer.checkpoint(Phase.RUNTIME_STATE, self.snap.payload(), step=self.snap.step)

    def drive(self) -> AgentResult:
        """Step until a final answer (completed) or a pause; failures raise."""
        snap = self.snap
        while True:
            response = snap.pending
            if response is None:
                if snap.stage != STAGE_STEP_STARTED:
                    if snap.step >= self.agent.max_steps:
                        raise MaxStepsError(self.run_id, self.agent.max_steps)
                    snap.step += 1
                    self.checkpoint(
                        Phase.STEP_STARTED,
                        {"state": snap.state, "message_count": len(snap.messages)},
                    )
                    self.snapshot(STAGE_STEP_STARTED)
                response = self.call_llm()
            if not response.tool_calls:
                return self.finish(response)
            paused = self.run_calls(response)
            if paused is not None:
                return paused

    # -- the LLM ------------------------------------------------------------------

    def call_llm(self) -> LLMResponse:
        """``pre_llm``, the journaled model call (with retries), ``post_llm`` and its snapshot."""
        snap, agent = self.snap, self.agent
        self.checkpoint(
            Phase.PRE_LLM,
            {
                "model": snap.requested_model,
                "provider": snap.provider,
                "message_count": len(snap.messages),
            },
        )
        key = f"step{snap.step}/llm"
        specs = self.specs

        def invoke(messages: list[dict[str, Any]], model: str | None) -> dict[str, Any]:
            answer = call_maybe_async(agent.llm, messages, specs)
            if not isinstance(answer, LLMResponse):
                raise TypeError(
                    f"agent {agent.name!r}: llm() returned {type(answer).__name__}, not LLMResponse"
                )
            data: dict[str, Any] = msgspec.to_builtins(answer)
            return data

        attempts = max(0, agent.llm_retries) + 1
        for attempt in range(attempts):
            replayed = self.tools.replayable(key)
            try:
                with defer_stop():  # SIGTERM: keep the answer we pay for, then stop
                    data = self.writer.effects.call(
                        key,
                        invoke,
                        (snap.messages, snap.requested_model),
                        name="llm",
                        step=snap.step,
                        idempotent=True,  # a repeated model call costs money, it changes nothing
                        in_doubt="retry",
                        retry_errors=True,
                    )
            except JOURNAL_ERRORS:
                raise
            except Exception as exc:
                log.warning(
                    "run %s: LLM call of step %d failed (attempt %d/%d): %s",
                    self.run_id, snap.step, attempt + 1, attempts, exc,
                )  # fmt: skip
                if attempt + 1 == attempts:
                    raise LLMFailedError(self.run_id, snap.step, exc) from exc
                time.sleep(agent.retry_backoff_s * (2**attempt))
                continue
            break
        response = msgspec.convert(data, LLMResponse)
        if replayed:
            snap.replayed_effect_count += 1
        snap.add_response(response)
        snap.messages.append(assistant_message(response))
        snap.pending_llm_response = msgspec.to_builtins(response)
        self.checkpoint(
            Phase.POST_LLM,
            {
                "model": snap.normalized_model or snap.requested_model,
                "provider": snap.provider,
                "finish_reason": response.finish_reason,
                "tool_call_count": len(response.tool_calls),
                "session_token": snap.session_token,
                "checkpoint_token": snap.checkpoint_token,
                "total_cost_usd": snap.total_cost_usd,
            },
        )
        self.snapshot(STAGE_POST_LLM)
        return response

    def finish(self, response: LLMResponse) -> AgentResult:
        """Write the completed ``run_terminal`` with the final answer."""
        snap = self.snap
        snap.final_text = response.text
        snap.final_structured = response.structured
        snap.pending_llm_response = None
        snap.state = "completed"
        result = snap.result(self.run_id, self.thread_id, "completed")
        self.writer.finish(
            msgspec.to_builtins(result), final_text=snap.final_text, **snap.model_fields()
        )
        return result

    # -- tools and subagents ----------------------------------------------------------

    def run_calls(self, response: LLMResponse) -> AgentResult | None:
        """Run one response's calls; returns a paused result, or None to take the next step."""
        snap = self.snap
        calls = list(response.tool_calls)
        keys = dict(zip(map(id, calls), call_keys(snap.step, calls, "call"), strict=True))
        sub_calls = [c for c in calls if isinstance(self.table.get(c.name), Agent)]
        tool_calls = [c for c in calls if not isinstance(self.table.get(c.name), Agent)]
        denied = self.approvals(tool_calls, keys)
        if isinstance(denied, AgentResult):
            return denied
        outcomes: dict[int, CallOutcome] = {}
        if sub_calls:
            self.checkpoint(
                Phase.PRE_SUBAGENT_BATCH,
                {
                    "targets": [self._agent(c).name for c in sub_calls],
                    "router_parallel": self.agent.parallel_subagents,
                },
            )
            done = run_batch(
                [self._sub_job(c, keys[id(c)]) for c in sub_calls], self.agent.parallel_subagents
            )
            outcomes.update(zip(map(id, sub_calls), done, strict=True))
            failures = sum(not o.ok for o in done)
            self.checkpoint(
                Phase.POST_SUBAGENT_BATCH,
                {"success_count": len(done) - failures, "failure_count": failures},
            )
        if tool_calls:
            self.checkpoint(Phase.PRE_TOOL_BATCH, {"tool_call_count": len(tool_calls)})
            jobs = [self._tool_job(c, keys[id(c)], denied) for c in tool_calls]
            done = run_batch(jobs, self.agent.parallel_tools)
            outcomes.update(zip(map(id, tool_calls), done, strict=True))
            self.checkpoint(
                Phase.POST_TOOL_BATCH,
                {
                    "tool_calls_total": snap.tool_calls + len(calls),
                    "tool_failures": sum(not o.ok and not o.denied for o in done),
                },
            )
        ordered = [outcomes[id(c)] for c in calls]
        snap.replayed_effect_count += sum(o.replayed for o in ordered)
        failed = next((o for o in ordered if not o.ok and not o.denied), None)
        if failed is not None and self.agent.tool_errors == "fail":
            raise ToolFailedError(self.run_id, failed.call.name, failed.call.id, failed.error or "")
        for outcome in ordered:
            kind = "subagent" if outcome.child_run_id is not None else "tool"
            record = outcome.record(snap.step, kind)
            snap.tool_executions.append(record)
            if kind == "subagent":
                snap.subagent_executions.append(record)
            snap.messages.append(
                {"role": "tool", "tool_call_id": outcome.call.id, "content": outcome.content()}
            )
        snap.tool_calls += len(calls)
        snap.pending_llm_response = None
        self.snapshot(STAGE_POST_TOOLS)
        return None

    def _agent(self, call: ToolCall) -> Agent:
        target = self.table[call.name]
        assert isinstance(target, Agent)
        return target

    def _sub_job(self, call: ToolCall, key: str) -> Any:
        start_child, parent, step = self.start_child, self.run_id, self.snap.step
        agent = self._agent(call)

        def start(sub: Agent, task: str, child: str) -> dict[str, Any]:
            return start_child(sub, task, child, parent)

        sub_key = key.replace("/call/", "/subagent/", 1)
        return lambda: self.tools.subagent(step, sub_key, call, agent, start)

    def _tool_job(self, call: ToolCall, key: str, denied: dict[str, str | None]) -> Any:
        step = self.snap.step
        spec = self.table.get(call.name)
        if key in denied:
            return lambda: CallOutcome(call, ok=False, denied=True, error=denied[key])
        tool = spec if isinstance(spec, Tool) else None
        return lambda: self.tools.tool(step, key.replace("/call/", "/tool/", 1), call, tool)

    def approvals(
        self, calls: list[ToolCall], keys: dict[int, str]
    ) -> AgentResult | dict[str, str | None]:
        """Decisions for calls that need approval: the denied keys, or a paused result."""
        journal = self.writer.effects
        denied: dict[str, str | None] = {}
        for call in calls:
            spec = self.table.get(call.name)
            if not isinstance(spec, Tool) or not spec.requires_approval:
                continue
            key = keys[id(call)]
            approval_key = key.replace("/call/", "/approval/", 1)
            recorded = journal.lookup(approval_key)
            if recorded is not None and recorded.status == "ok" and recorded.outcome is not None:
                value = recorded.outcome.result
            elif self.input is not NO_INPUT:
                answer, self.input = self.input, NO_INPUT
                value = journal.call(
                    approval_key,
                    lambda answer: answer,
                    (answer,),
                    name="@approval",
                    step=self.snap.step,
                    idempotent=True,
                )
            else:
                return self.pause(call)
            approved, reason = decision(value)
            if not approved:
                denied[key] = reason
        return denied

    def pause(self, call: ToolCall) -> AgentResult:
        """Durably pause the run for a decision on ``call``."""
        pending = {
            "kind": APPROVAL,
            "prompt": {
                "tool_call": msgspec.to_builtins(call),
                "message": f"approve the call of tool {call.name!r}?",
            },
        }
        self.writer.pause(APPROVAL, pending["prompt"], step=self.snap.step)
        log.info("run %s: paused for approval of %s (call %s)", self.run_id, call.name, call.id)
        return self.snap.result(self.run_id, self.thread_id, "paused", pending=pending)


__all__ = ["APPROVAL", "NO_INPUT", "AgentLoop", "LLMFailedError", "MaxStepsError", "decision"]
