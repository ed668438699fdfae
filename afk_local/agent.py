"""The agent loop with the checkpoint phase protocol (DESIGN §6): :class:`AgentRunner`.

Each step writes ``step_started``, ``pre_llm``, ``post_llm``, then (when the
model asked for tools) ``pre_subagent_batch``/``post_subagent_batch`` and
``pre_tool_batch``/``post_tool_batch``; a full ``runtime_state`` snapshot
follows ``step_started``, ``post_llm`` (holding ``pending_llm_response``) and
the tool batches. The LLM call and every tool call go through the effect
journal, so a crash at any instant repeats neither:

- the LLM call is journaled per step (``step{n}/llm``): a crash after the
  model answered but before ``post_llm`` was durable replays the answer
  instead of paying for it again — and, more important, keeps the tool call
  ids the same, so the tool journal keys (``step{n}/tool/{id}``) still match;
- a checkpointed ``pending_llm_response`` is never sent to the model again:
  its tool calls run, each replayed from the journal when it had finished.

Example:
    >>> import afk_local as afk
    >>> def llm(messages, tools):
    ...     return afk.LLMResponse(text="hello", finish_reason="stop")
    >>> agent = afk.Agent("greeter", "Be brief.", llm)
    >>> runner = afk.AgentRunner("/tmp/afk-doc-agent")
    >>> runner.run(agent, "hi").final_text
    'hello'
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import msgspec

from afk_local.agent_state import (
    STAGE_POST_LLM,
    STAGE_POST_TOOLS,
    STAGE_STEP_STARTED,
    Snapshot,
    result_from_terminal,
)
from afk_local.agent_tools import (
    JOURNAL_ERRORS,
    CallOutcome,
    SubagentFailedError,
    ToolExecutor,
    ToolFailedError,
    call_keys,
    call_maybe_async,
    run_batch,
)
from afk_local.agent_types import (
    Agent,
    AgentResult,
    LLMResponse,
    Tool,
    ToolCall,
    assistant_message,
    tool,
)
from afk_local.errors import AfkLocalError, RunCancelledError, RunExistsError, WriterFailedError
from afk_local.records import Phase, RunMeta, RunStatus
from afk_local.runner import StoreLike, _as_store, _sigterm_exits
from afk_local.store import Store
from afk_local.writer import DurableWriter, validate_durability

log = logging.getLogger("afk_local")

_NO_INPUT: Any = object()
_APPROVAL = "approval"


class LLMFailedError(AfkLocalError):
    """The LLM callable still raised after its retries (the run ends ``failed``)."""

    def __init__(self, run_id: str, step: int, cause: BaseException) -> None:
        self.run_id = run_id
        self.step = step
        super().__init__(
            f"run {run_id!r}: the LLM failed at step {step}: {type(cause).__name__}: {cause}. "
            f"`runner.resume(agent, {run_id!r})` retries from the newest snapshot"
        )


class MaxStepsError(AfkLocalError):
    """The agent used ``max_steps`` LLM steps without a final answer."""

    def __init__(self, run_id: str, max_steps: int) -> None:
        self.run_id = run_id
        super().__init__(
            f"run {run_id!r}: no final answer after max_steps={max_steps}; raise max_steps "
            f"and resume with `runner.resume(agent, {run_id!r})`"
        )


def decision(value: Any) -> tuple[bool, str | None]:
    """``(approved, reason)`` from a resume input: ``True``/``False``, or ``{"decision": ...}``."""
    reason = None
    if isinstance(value, dict):
        reason = value.get("reason")
        value = value.get("decision", value.get("approved"))
    if isinstance(value, str):
        return value.strip().lower() in ("approve", "approved", "yes", "y", "allow", "true"), reason
    return bool(value), reason if isinstance(reason, str) else None


class AgentRunner:
    """Runs :class:`~afk_local.Agent` loops as durable runs in a store.

    Args:
        store: a :class:`~afk_local.Store` or its root (default ``$AFK_LOCAL_ROOT``
            else ``./.afk``).
        durability: ``"sync"``, ``"async"`` or ``"exit"`` for checkpoints; the
            journal (LLM answers, tool results) is synchronous in every mode.
        flush_timeout_s: bound on waiting for queued checkpoints (async/exit).
        in_doubt: policy for tool calls a crash cut short (``"retry"``,
            ``"raise"``, or a callable); None: retry ``idempotent`` tools, raise
            :class:`~afk_local.EffectInDoubtError` for the others.
    """

    def __init__(
        self,
        store: StoreLike = None,
        *,
        durability: str = "sync",
        flush_timeout_s: float = 30.0,
        in_doubt: Any = None,
    ) -> None:
        self.store: Store = _as_store(store)
        self.durability = validate_durability(durability)
        self.flush_timeout_s = flush_timeout_s
        self.in_doubt = in_doubt

    def __repr__(self) -> str:
        return f"AgentRunner(root={str(self.store.root)!r}, durability={self.durability!r})"

    # -- entry points -------------------------------------------------------------

    def run(
        self,
        agent: Agent,
        user_message: str,
        run_id: str | None = None,
        thread_id: str | None = None,
        context: dict[str, Any] | None = None,
        *,
        parent_run_id: str | None = None,
    ) -> AgentResult:
        """Start a run of ``agent`` on ``user_message`` (an existing ``run_id`` is resumed).

        Returns when the run completed, failed or paused (``result.state``).
        """
        if run_id is not None and self.store.exists(run_id):
            return self.resume(agent, run_id)
        params = {"user_message": user_message, "context": dict(context or {})}
        try:
            run = self.store.create(
                run_id,
                thread_id=thread_id,
                params=params,
                parent_run_id=parent_run_id,
                extra={"agent": agent.name},
            )
        except RunExistsError:
            assert run_id is not None
            return self.resume(agent, run_id)
        writer = self._writer(run)
        snap = self._fresh(agent, run.meta)
        return self._attempt(agent, writer, snap, resumed=False, input_value=_NO_INPUT)

    def resume(
        self,
        agent: Agent,
        run_id: str,
        input: Any = None,
        *,
        on_corrupt: str = "raise",
    ) -> AgentResult:
        """Continue run ``run_id`` (DESIGN §6 resume contract).

        A completed run returns its stored result, calling nothing. A paused run
        needs ``input`` (``True``/``False`` or ``{"decision": "approve"|"deny",
        "reason": ...}``); without it the paused result is returned unchanged.
        Anything else (interrupted, failed) continues from the newest
        ``runtime_state``; with ``on_corrupt="fallback"`` a damaged newest
        snapshot is skipped for the newest readable one (the journal keeps
        effects from repeating).

        Raises:
            CheckpointCorruptionError: the newest snapshot is unreadable (``on_corrupt="raise"``).
            RunCancelledError: the run was cancelled.
        """
        value = _NO_INPUT if input is None else input
        meta = self.store.read_meta(run_id)
        done = self._settled(meta, value)
        if done is not None:
            return done
        run = self.store.resume_writer(run_id)
        writer = self._writer(run)
        try:
            done = self._settled(run.meta, value)  # re-read under the lock
            if done is None:
                done = self._finished_unmarked(writer)
            if done is None:
                state = run.reader().resume_state(on_corrupt=on_corrupt)
                if state.skipped:
                    log.warning(
                        "run %s: resuming from an older snapshot, skipped %s",
                        run_id, ", ".join(f"{s.name} ({s.reason})" for s in state.skipped),
                    )  # fmt: skip
                payload = state.state
                if isinstance(payload, dict):
                    snap = Snapshot.from_payload(payload)
                else:
                    snap = self._fresh(agent, run.meta)
        except BaseException:
            writer.close()
            raise
        if done is not None:
            writer.close()
            return done
        return self._attempt(agent, writer, snap, resumed=True, input_value=value)

    # -- one attempt ----------------------------------------------------------------

    def _writer(self, run: Any) -> DurableWriter:
        return DurableWriter(run, self.durability, flush_timeout_s=self.flush_timeout_s)  # type: ignore[arg-type]

    def _fresh(self, agent: Agent, meta: RunMeta) -> Snapshot:
        params = meta.params if isinstance(meta.params, dict) else {}
        messages: list[dict[str, Any]] = []
        if agent.instructions:
            messages.append({"role": "system", "content": agent.instructions})
        messages.append({"role": "user", "content": params.get("user_message", "")})
        return Snapshot(
            agent_name=agent.name,
            messages=messages,
            context=dict(params.get("context") or {}),
            started_at_s=meta.created_ms / 1000,
            requested_model=agent.model,
            provider=agent.provider,
        )

    def _settled(self, meta: RunMeta, value: Any) -> AgentResult | None:
        if meta.status is RunStatus.COMPLETED:
            state = self.store.open(meta.run_id).resume_state()
            return result_from_terminal(state.result, meta.run_id)
        if meta.status is RunStatus.CANCELLED:
            reason = meta.extra.get("cancel_reason")
            raise RunCancelledError(meta.run_id, reason if isinstance(reason, str) else None)
        if meta.status is RunStatus.PAUSED and value is _NO_INPUT:
            pause = meta.pause
            return AgentResult(
                run_id=meta.run_id,
                thread_id=meta.thread_id,
                state="paused",
                pending={"kind": pause.kind, "prompt": pause.prompt} if pause else None,
            )
        if value is not _NO_INPUT and meta.status is not RunStatus.PAUSED:
            raise ValueError(
                f"run {meta.run_id!r} is {meta.status}, not paused: input is only for paused runs"
            )
        return None

    def _finished_unmarked(self, writer: DurableWriter) -> AgentResult | None:
        """A completed ``run_terminal`` that a crash kept out of ``run.meta``: honour it."""
        latest = writer.run.reader().latest()
        if latest is None or latest.phase != Phase.RUN_TERMINAL.value:
            return None
        payload = latest.payload if isinstance(latest.payload, dict) else {}
        if payload.get("state") != RunStatus.COMPLETED.value or "terminal_result" not in payload:
            return None
        writer.update_meta(status=RunStatus.COMPLETED, pause=None, error=None)
        return result_from_terminal(payload["terminal_result"], writer.run_id)

    def _attempt(
        self,
        agent: Agent,
        writer: DurableWriter,
        snap: Snapshot,
        *,
        resumed: bool,
        input_value: Any,
    ) -> AgentResult:
        try:
            loop = _Loop(self, agent, writer, snap, input_value)
            with _sigterm_exits():
                writer.update_meta(status=RunStatus.RUNNING, pause=None, error=None)
                writer.checkpoint(
                    Phase.RUN_STARTED,
                    {"agent_name": agent.name, "resumed": resumed},
                    step=snap.step,
                )
                if input_value is not _NO_INPUT:
                    writer.checkpoint(Phase.RESUMED, {"kind": _APPROVAL}, step=snap.step)
                result = loop.drive()
        except (LLMFailedError, ToolFailedError, MaxStepsError) as exc:
            return self._failed(loop, exc)
        except Exception as exc:
            if not isinstance(exc, WriterFailedError) and writer.failed is None:
                with contextlib.suppress(Exception):
                    writer.fail(exc, **snap.model_fields())
            _close(writer)
            raise
        except BaseException:
            _close(writer)  # stopped (SIGTERM, Ctrl-C), not failed: queued checkpoints flush
            raise
        _close(writer)
        return result

    def _failed(self, loop: _Loop, exc: AfkLocalError) -> AgentResult:
        snap, writer = loop.snap, loop.writer
        try:
            writer.fail(exc, final_text=snap.final_text, **snap.model_fields())
        finally:
            _close(writer)
        log.error("%s", exc)
        return snap.result(writer.run_id, writer.run.meta.thread_id, "failed", error=str(exc))

    def _child(self, agent: Agent, task: str, child_id: str, parent: str) -> dict[str, Any]:
        """Run or resume a subagent's child run; what the parent's journal records."""
        result = self.run(agent, task, run_id=child_id, parent_run_id=parent)
        if result.state != "completed":
            raise SubagentFailedError(parent, child_id, result.state, result.error)
        return {"run_id": child_id, "final_text": result.final_text, "usage": result.usage}


def _close(writer: DurableWriter) -> None:
    try:
        writer.close()
    except Exception as exc:
        log.error("run %s: closing the writer failed: %s", writer.run_id, exc)


class _Loop:
    """The state machine of one attempt: steps until a final answer, a pause or a failure."""

    def __init__(
        self, runner: AgentRunner, agent: Agent, writer: DurableWriter, snap: Snapshot, value: Any
    ) -> None:
        self.runner = runner
        self.agent = agent
        self.writer = writer
        self.snap = snap
        self.input = value
        self.run_id = writer.run_id
        self.thread_id = writer.run.meta.thread_id
        self.table = agent.tool_table()
        self.specs = agent.tool_specs()
        self.tools = ToolExecutor(
            writer.effects, self.run_id, in_doubt=runner.in_doubt, backoff_s=agent.retry_backoff_s
        )
        if snap.requested_model is None:
            snap.requested_model = agent.model

    def checkpoint(self, phase: Phase, payload: dict[str, Any]) -> None:
        self.writer.checkpoint(phase, payload, step=self.snap.step)

    def snapshot(self, stage: str) -> None:
        self.snap.stage = stage
        self.writer.checkpoint(Phase.RUNTIME_STATE, self.snap.payload(), step=self.snap.step)

    def drive(self) -> AgentResult:
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
        runner, parent, step = self.runner, self.run_id, self.snap.step
        agent = self._agent(call)

        def start(sub: Agent, task: str, child: str) -> dict[str, Any]:
            return runner._child(sub, task, child, parent)

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
            elif self.input is not _NO_INPUT:
                answer, self.input = self.input, _NO_INPUT
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
        pending = {
            "kind": _APPROVAL,
            "prompt": {
                "tool_call": msgspec.to_builtins(call),
                "message": f"approve the call of tool {call.name!r}?",
            },
        }
        self.writer.pause(_APPROVAL, pending["prompt"], step=self.snap.step)
        log.info("run %s: paused for approval of %s (call %s)", self.run_id, call.name, call.id)
        return self.snap.result(self.run_id, self.thread_id, "paused", pending=pending)


__all__ = [
    "Agent",
    "AgentResult",
    "AgentRunner",
    "LLMFailedError",
    "LLMResponse",
    "MaxStepsError",
    "SubagentFailedError",
    "Tool",
    "ToolCall",
    "ToolFailedError",
    "decision",
    "tool",
]
