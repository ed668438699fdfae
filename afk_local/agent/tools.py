"""Executing one step's tool and subagent calls, each through the effect journal.

Every call is journaled on its own (intent before, outcome after) under a key
that is stable across resumes — ``step{n}/tool/{call_id}`` — because the LLM
response that named the calls is itself checkpointed or journaled, so its call
ids never change. A batch runs in threads when the agent allows it; the journal
is thread-safe and group-commits their fsyncs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import hashlib
import inspect
import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from afk_local.agent.types import Agent, Tool, ToolCall
from afk_local.errors import (
    EffectInDoubtError,
    EffectLogCorruptionError,
    EffectMismatchError,
    SubagentFailedError,
    ToolFailedError,
    WriterFailedError,
)
from afk_local.journal.journal import Journal
from afk_local.runner.run.stopping import defer_stop

log = logging.getLogger("afk_local")

_SAFE = re.compile(r"[^A-Za-z0-9._-]")

JOURNAL_ERRORS = (
    EffectInDoubtError,
    EffectMismatchError,
    EffectLogCorruptionError,
    WriterFailedError,
)
"""Errors of the run's own bookkeeping: never retried or handed to the model."""


@dataclass
class CallOutcome:
    """How one tool or subagent call ended."""

    call: ToolCall
    ok: bool
    result: Any = None
    error: str | None = None
    replayed: bool = False
    denied: bool = False
    child_run_id: str | None = None

    def content(self) -> str:
        """The tool message's content for the model."""
        if self.denied:
            return f"Denied by a person{': ' + self.error if self.error else ''}"
        if not self.ok:
            return f"Error: {self.error}"
        if isinstance(self.result, str):
            return self.result
        return json.dumps(self.result, default=str)

    def record(self, step: int, kind: str) -> dict[str, Any]:
        """The ``tool_executions`` entry (deterministic: the same with or without crashes)."""
        entry: dict[str, Any] = {
            "step": step,
            "id": self.call.id,
            "name": self.call.name,
            "kind": kind,
            "arguments": self.call.arguments,
            "status": "denied" if self.denied else ("ok" if self.ok else "error"),
        }
        if self.error is not None:
            entry["error"] = self.error
        if self.child_run_id is not None:
            entry["child_run_id"] = self.child_run_id
        return entry


def call_keys(step: int, calls: list[ToolCall], kind: str) -> list[str]:
    """Journal keys ``step{n}/{kind}/{id}``; a repeated id gets ``#index`` to stay unique."""
    seen: dict[str, int] = {}
    for call in calls:
        seen[call.id] = seen.get(call.id, 0) + 1
    return [
        f"step{step}/{kind}/{call.id}" + (f"#{i}" if seen[call.id] > 1 else "")
        for i, call in enumerate(calls)
    ]


def child_run_id(parent: str, step: int, call_id: str) -> str:
    """A subagent's run id: derived from the parent run, step and call (stable across resumes)."""
    candidate = f"{parent}.s{step}.{_SAFE.sub('_', call_id)}"
    if len(candidate) <= 128:
        return candidate
    digest = hashlib.blake2b(candidate.encode(), digest_size=8).hexdigest()
    return f"{parent[:100]}.s{step}.{digest}"


def call_maybe_async(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """Call ``fn``; when it returns an awaitable, run it to completion on a fresh loop."""
    result = fn(*args, **kwargs)
    if not inspect.isawaitable(result):
        return result
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_await(result))
    # This thread already runs a loop (a notebook): finish the coroutine in another thread.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, _await(result)).result()


async def _await(awaitable: Any) -> Any:
    return await awaitable


def sync_callable(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` as a plain function (async functions run on a fresh loop); signature kept."""
    if not inspect.iscoroutinefunction(fn):
        return fn

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        return call_maybe_async(fn, *args, **kwargs)

    return run


def run_batch(jobs: list[Callable[[], CallOutcome]], parallel: bool) -> list[CallOutcome]:
    """Run ``jobs`` (in threads when ``parallel`` and more than one); results in order.

    A SIGTERM during a parallel batch stops the run once every call of it ended
    (their outcomes journaled): the pool waits for its threads anyway.
    """
    if not parallel or len(jobs) < 2:
        return [job() for job in jobs]
    with (
        defer_stop(),
        concurrent.futures.ThreadPoolExecutor(
            max_workers=min(len(jobs), 32), thread_name_prefix="afk-tool"
        ) as pool,
    ):
        futures = [pool.submit(job) for job in jobs]
        return [future.result() for future in futures]


class ToolExecutor:
    """Runs the journaled calls of one run; shared by the steps of an attempt."""

    def __init__(
        self,
        journal: Journal,
        run_id: str,
        *,
        in_doubt: Any = None,
        backoff_s: float = 0.5,
    ) -> None:
        self.journal = journal
        self.run_id = run_id
        self.in_doubt = in_doubt
        self.backoff_s = backoff_s

    def replayable(self, key: str) -> bool:
        """True when ``key`` has an ``ok`` outcome (calling it will replay, not execute)."""
        state = self.journal.lookup(key)
        return state is not None and state.status == "ok"

    def tool(self, step: int, key: str, call: ToolCall, spec: Tool | None) -> CallOutcome:
        """Execute (or replay) one tool call; errors become a failed outcome."""
        if spec is None:
            return CallOutcome(call, ok=False, error=f"unknown tool {call.name!r}")
        replayed = self.replayable(key)
        fn = sync_callable(spec.fn)
        attempts = max(0, spec.retries) + 1
        for attempt in range(attempts):
            try:
                with defer_stop():  # SIGTERM: the call finishes and is journaled first
                    result = self.journal.call(
                        key,
                        fn,
                        (),
                        dict(call.arguments),
                        name=spec.name,
                        step=step,
                        idempotent=spec.idempotent,
                        in_doubt=self.in_doubt,
                        retry_errors=True,
                    )
            except JOURNAL_ERRORS:
                raise
            except Exception as exc:
                log.warning(
                    "run %s: tool %s (call %s) raised on attempt %d/%d: %s",
                    self.run_id, spec.name, call.id, attempt + 1, attempts, exc,
                )  # fmt: skip
                if attempt + 1 == attempts:
                    return CallOutcome(call, ok=False, error=f"{type(exc).__name__}: {exc}")
                time.sleep(self.backoff_s * (2**attempt))
                continue
            return CallOutcome(call, ok=True, result=result, replayed=replayed)
        raise AssertionError("unreachable")  # pragma: no cover

    def subagent(
        self,
        step: int,
        key: str,
        call: ToolCall,
        agent: Agent,
        start_child: Callable[[Agent, str, str], dict[str, Any]],
    ) -> CallOutcome:
        """Run (or replay) a subagent call as a child run.

        The call is journaled as idempotent: a parent crash while the child ran
        leaves it in doubt, and calling again resumes the child run, whose own
        checkpoints and journal make that safe (a finished child returns its
        stored result without running anything).
        """
        child = child_run_id(self.run_id, step, call.id)
        task = call.arguments.get("task")
        if not isinstance(task, str):
            task = json.dumps(call.arguments)
        replayed = self.replayable(key)
        try:
            result = self.journal.call(
                key,
                lambda task, child: start_child(agent, task, child),
                (task, child),
                name=f"subagent:{agent.name}",
                step=step,
                idempotent=True,
                in_doubt="retry",
                retry_errors=True,
            )
        except JOURNAL_ERRORS:
            raise
        except Exception as exc:
            return CallOutcome(
                call, ok=False, error=f"{type(exc).__name__}: {exc}", child_run_id=child
            )
        text = result.get("final_text") if isinstance(result, dict) else result
        return CallOutcome(call, ok=True, result=text, replayed=replayed, child_run_id=child)


__all__ = [
    "JOURNAL_ERRORS",
    "CallOutcome",
    "SubagentFailedError",
    "ToolExecutor",
    "ToolFailedError",
    "call_keys",
    "call_maybe_async",
    "child_run_id",
    "run_batch",
    "sync_callable",
]
