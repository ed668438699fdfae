"""The agent loop with the checkpoint phase protocol (docs/agent.md): :class:`AgentRunner`.

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

Runs record an entrypoint (``"module:qualname"`` of a module-level ``Agent``,
or ``Agent(entrypoint=...)``) and ``extra["kind"] = "agent"``, so another
process — ``afk-local resume RUN``, the watcher — can rebuild the agent and
continue the run (:mod:`afk_local.agent.rebuild`).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from afk_local.agent.loop import (
    APPROVAL,
    NO_INPUT,
    AgentLoop,
    LLMFailedError,
    MaxStepsError,
    decision,
)
from afk_local.agent.state import Snapshot, result_from_terminal
from afk_local.agent.tools import SubagentFailedError, ToolFailedError
from afk_local.agent.types import (
    Agent,
    AgentResult,
    LLMResponse,
    Tool,
    ToolCall,
    tool,
)
from afk_local.errors import AfkLocalError, RunCancelledError, RunExistsError, WriterFailedError
from afk_local.runner.code.origin import UNRESUMABLE_KEY
from afk_local.runner.run.answers import check_answer
from afk_local.runner.run.script_exit import install_script_excepthook
from afk_local.runner.run.stopping import sigterm_exits
from afk_local.runner.writer import DurableWriter, validate_durability
from afk_local.storage.format.records import Phase, RunMeta, RunStatus
from afk_local.storage.store import Store, StoreLike, as_store

log = logging.getLogger("afk_local")

AGENT_KIND = "agent"
"""``RunMeta.extra["kind"]`` of agent runs."""

_AGENTS: dict[str, Agent] = {}
"""Entrypoint -> module-level agent run in this process (``__main__`` ones resume here only)."""


class AgentRunner:
    """Runs :class:`~afk_local.Agent` loops as durable runs in a store.

    Args:
        store: a :class:`~afk_local.Store` or its root (default ``$AFK_LOCAL_ROOT``
            else ``./.afk``).
        durability: ``"sync"``, ``"async"`` or ``"exit"`` for checkpoints; the
            journal (LLM answers, tool results) is synchronous in every mode.
        flush_timeout_s: bound on waiting for queued checkpoints (async/exit).
        in_doubt: policy for tool calls a crash cut short (``"retry"``,
            ``"raise"``, or a callable); None: retry ``idempotent`` tools and tools
            that take an ``idempotency_key``, raise
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
        self.store: Store = as_store(store)
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
        install_script_excepthook()
        return self._start(
            agent, user_message, run_id, thread_id=thread_id, context=context,
            parent_run_id=parent_run_id,
        )  # fmt: skip

    def _start(
        self,
        agent: Agent,
        user_message: str,
        run_id: str | None,
        *,
        thread_id: str | None = None,
        context: dict[str, Any] | None = None,
        parent_run_id: str | None = None,
        subagent: bool = False,
    ) -> AgentResult:
        if run_id is not None and self.store.exists(run_id):
            return self.resume(agent, run_id)
        params = {"user_message": user_message, "context": dict(context or {})}
        # A subagent's child run gets no entrypoint: only its parent resumes it (a
        # watcher resuming it too would race the parent for its lock).
        entrypoint = None if subagent else self._entrypoint(agent)
        try:
            run = self.store.create(
                run_id,
                thread_id=thread_id,
                entrypoint=entrypoint,
                params=params,
                parent_run_id=parent_run_id,
                extra=self._extra(agent, subagent=subagent),
            )
        except RunExistsError:
            assert run_id is not None
            return self.resume(agent, run_id)
        writer = self._writer(run)
        snap = self._fresh(agent, run.meta)
        return self._attempt(agent, writer, snap, resumed=False, input_value=NO_INPUT)

    def resume(
        self,
        agent: Agent,
        run_id: str,
        input: Any = None,
        *,
        on_corrupt: str = "raise",
        pause_seq: int | None = None,
    ) -> AgentResult:
        """Continue run ``run_id`` (the resume contract of docs/agent.md).

        A completed run returns its stored result, calling nothing. A paused run
        needs ``input`` (``True``/``False`` or ``{"decision": "approve"|"deny",
        "reason": ...}``); without it the paused result is returned unchanged.
        Anything else (interrupted, failed) continues from the newest
        ``runtime_state``; with ``on_corrupt="fallback"`` a damaged newest
        snapshot is skipped for the newest readable one (the journal keeps
        effects from repeating). With ``pause_seq``, ``input`` answers only the pause
        at that checkpoint (:mod:`afk_local.runner.run.answers`).

        Raises:
            CheckpointCorruptionError: the newest snapshot is unreadable (``on_corrupt="raise"``).
            RunCancelledError: the run was cancelled.
            PauseMismatchError: ``pause_seq`` names a pause the run no longer waits at.
        """
        install_script_excepthook()
        value = NO_INPUT if input is None else input
        meta = self.store.read_meta(run_id)
        done = self._settled(meta, value, pause_seq)
        if done is not None:
            return done
        run = self.store.resume_writer(run_id)
        if UNRESUMABLE_KEY in run.meta.extra:  # this attempt found its agent: say so no more
            extra = {k: v for k, v in run.meta.extra.items() if k != UNRESUMABLE_KEY}
            run.update_meta(extra=extra)
        writer = self._writer(run)
        try:
            done = self._settled(run.meta, value, pause_seq)  # re-read under the lock
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

    def _entrypoint(self, agent: Agent) -> str | None:
        """Where another process rebuilds ``agent`` from (registered for in-process resumes)."""
        entrypoint = agent.find_entrypoint()
        if entrypoint is None:
            log.info(
                "agent %r is not a module-level object and has no Agent(entrypoint=...): "
                "its runs resume only through runner.resume(agent, run_id), not the watcher",
                agent.name,
            )
        elif agent.entrypoint is None:
            _AGENTS[entrypoint] = agent  # the object itself: `afk.resume(run_id)` works here
        return entrypoint

    def _extra(self, agent: Agent, *, subagent: bool = False) -> dict[str, Any]:
        """``RunMeta.extra`` of an agent run: kind and the options a resume rebuilds us with."""
        extra: dict[str, Any] = {
            "agent": agent.name,
            "kind": AGENT_KIND,
            "runner": {
                "durability": self.durability,
                "flush_timeout_s": self.flush_timeout_s,
                "in_doubt": self.in_doubt if isinstance(self.in_doubt, str) else None,
            },
        }
        if subagent:
            extra["subagent"] = True
        return extra

    def _identity(self, agent: Agent, meta: RunMeta) -> dict[str, Any]:
        """Meta fields that make an older run without entrypoint resumable by the watcher."""
        if meta.entrypoint is not None or meta.parent_run_id is not None:
            return {}
        if meta.extra.get("subagent"):
            return {}
        entrypoint = self._entrypoint(agent)
        if entrypoint is None:
            return {}
        return {"entrypoint": entrypoint, "extra": {**meta.extra, **self._extra(agent)}}

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

    def _settled(
        self, meta: RunMeta, value: Any, pause_seq: int | None = None
    ) -> AgentResult | None:
        if value is not NO_INPUT:
            check_answer(meta, pause_seq)
        if meta.status is RunStatus.COMPLETED:
            state = self.store.open(meta.run_id).resume_state()
            return result_from_terminal(state.result, meta.run_id)
        if meta.status is RunStatus.CANCELLED:
            reason = meta.extra.get("cancel_reason")
            raise RunCancelledError(meta.run_id, reason if isinstance(reason, str) else None)
        if meta.status is RunStatus.PAUSED and value is NO_INPUT:
            pause = meta.pause
            return AgentResult(
                run_id=meta.run_id,
                thread_id=meta.thread_id,
                state="paused",
                pending={"kind": pause.kind, "prompt": pause.prompt} if pause else None,
            )
        if value is not NO_INPUT and meta.status is not RunStatus.PAUSED:
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
            loop = AgentLoop(
                agent, writer, snap, input_value, in_doubt=self.in_doubt, start_child=self._child
            )
            with sigterm_exits():
                writer.update_meta(
                    status=RunStatus.RUNNING,
                    pause=None,
                    error=None,
                    **(self._identity(agent, writer.run.meta) if resumed else {}),
                )
                writer.checkpoint(
                    Phase.RUN_STARTED,
                    {"agent_name": agent.name, "resumed": resumed},
                    step=snap.step,
                )
                if input_value is not NO_INPUT:
                    writer.checkpoint(Phase.RESUMED, {"kind": APPROVAL}, step=snap.step)
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

    def _failed(self, loop: AgentLoop, exc: AfkLocalError) -> AgentResult:
        snap, writer = loop.snap, loop.writer
        try:
            writer.fail(exc, final_text=snap.final_text, **snap.model_fields())
        finally:
            _close(writer)
        log.error("%s", exc)
        return snap.result(writer.run_id, writer.run.meta.thread_id, "failed", error=str(exc))

    def _child(self, agent: Agent, task: str, child_id: str, parent: str) -> dict[str, Any]:
        """Run or resume a subagent's child run; what the parent's journal records."""
        result = self._start(agent, task, child_id, parent_run_id=parent, subagent=True)
        if result.state != "completed":
            raise SubagentFailedError(parent, child_id, result.state, result.error)
        return {"run_id": child_id, "final_text": result.final_text, "usage": result.usage}


def _close(writer: DurableWriter) -> None:
    try:
        writer.close()
    except Exception as exc:
        log.error("run %s: closing the writer failed: %s", writer.run_id, exc)


__all__ = [
    "AGENT_KIND",
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
