"""``DurableRunner``: the SDK's ``Runner.run`` / ``run_sync``, called the same way, made durable."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from agents import Agent, RunResult

from afk_local.integrations.openai_agents.in_job import run_in_job
from afk_local.integrations.openai_agents.standalone import (
    reset_call,
    result_of,
    set_call,
    standalone_call,
)
from afk_local.runner.run.current import current_run_context
from afk_local.runner.run.run_context import RunContext
from afk_local.runner.time.limits import Limit
from afk_local.runner.time.retry import Retry
from afk_local.storage.store import StoreLike

_USAGE = (
    "DurableRunner.run(starting_agent, input, **Runner.run kwargs) inside an @afk.durable "
    "job; DurableRunner.run(starting_agent, input, run_id=..., store=None) outside one"
)


class DurableRunner:
    """``Runner.run`` / ``Runner.run_sync``, called the same way, whose runs survive a kill.

    Three ways to call it:

    - drop-in, inside an ``@afk.durable`` job: ``DurableRunner.run_sync(agent, input,
      **kwargs)`` exactly as ``Runner.run_sync``; the job's context is found (the job
      body, the asyncio tasks it starts, ``asyncio.to_thread``; a plain thread when only
      one job runs in the process) and every call is a step of the job's run;
    - the same with the context first, ``DurableRunner.run_sync(ctx, agent, input)``;
    - standalone, outside any job: ``DurableRunner.run_sync(agent, input, run_id="r1",
      store=None)`` makes the agent run a durable run of its own, created or continued
      under ``run_id``; a finished run returns its stored result without calling the
      model. ``afk-local resume`` and the watcher continue it when the ``Agent`` is at the
      top level of an importable module and no ``Runner.run`` arguments but ``max_turns``
      were given; otherwise ``afk-local show`` says why only your code can.

    Every model call is a journaled step (replayed on resume, asked again if a crash cut it
    short: a call only reads). Every function tool call is a journaled step keyed by its call
    id: replayed when it finished; when a crash cut it short it is *in doubt*, and the resume
    stops with ``EffectInDoubtError`` unless the tool is named in ``idempotent_tools`` (then it
    is called again with the same :func:`tool_idempotency_key`). Handoffs made with
    ``handoff()`` or by listing an agent are journaled steps too (their ``on_handoff`` runs once).

    A run that ends with tool calls waiting for approval (``needs_approval``) pauses the job
    (``ctx.pause``, kind ``"approval"``): answer it from any process with
    ``afk-local resume RUN --input '{"CALL_ID": true}'`` (``false``, or a message, rejects
    the call) and the agent continues with those answers.
    """

    @classmethod
    async def run(
        cls,
        *args: Any,
        idempotent_tools: Iterable[str] = (),
        pause_for_approvals: bool = True,
        model_retry: Retry | None = None,
        model_limit: Limit | None = None,
        **kwargs: Any,
    ) -> RunResult:
        """``Runner.run(starting_agent, input, **kwargs)``, durable (see the class docstring).

        Args:
            *args: ``(starting_agent, input)`` as for ``Runner.run``, optionally after the
                job's ``ctx``.
            idempotent_tools: names of tools (and handoff tools) that may be called again
                after a crash.
            pause_for_approvals: False returns a result with ``interruptions`` to the caller.
            model_retry: an ``afk.Retry`` for each model call: a failed try is journaled
                with its error, the backoff is a durable sleep (``ctx.step(..., retry=)``).
            model_limit: an ``afk.Limit`` each model call waits for a place under (shared
                by every process of the store).
            **kwargs: the other arguments of ``Runner.run`` (``context``, ``max_turns``,
                ``hooks``, ``run_config``, ``session``, ...); outside a job also ``run_id``
                and ``store``.

        Raises:
            TypeError: no agent, or called outside any job without ``run_id``.
        """
        ctx, agent, input, run_id, store = _split(args, kwargs)
        options = _Options(idempotent_tools, pause_for_approvals, model_retry, model_limit)
        if ctx is not None:
            return await run_in_job(ctx, agent, input, **options.in_job(), **kwargs)
        job, job_args, call = standalone_call(
            agent, input, store=store, kwargs=kwargs, **options.in_job()
        )
        token = set_call(call)
        try:
            stored = await job.arun(*job_args, run_id=run_id)
        finally:
            reset_call(token)
        return result_of(call, stored, agent, input)

    @classmethod
    def run_sync(
        cls,
        *args: Any,
        idempotent_tools: Iterable[str] = (),
        pause_for_approvals: bool = True,
        model_retry: Retry | None = None,
        model_limit: Limit | None = None,
        **kwargs: Any,
    ) -> RunResult:
        """:meth:`run` on a new event loop, as ``Runner.run_sync`` (not inside a running loop)."""
        ctx, agent, input, run_id, store = _split(args, kwargs)
        options = _Options(idempotent_tools, pause_for_approvals, model_retry, model_limit)
        if ctx is not None:
            return asyncio.run(run_in_job(ctx, agent, input, **options.in_job(), **kwargs))
        job, job_args, call = standalone_call(
            agent, input, store=store, kwargs=kwargs, **options.in_job()
        )
        token = set_call(call)
        try:
            stored = job.run(*job_args, run_id=run_id)
        finally:
            reset_call(token)
        return result_of(call, stored, agent, input)


@dataclass(frozen=True)
class _Options:
    """``DurableRunner``'s own options of one call (the rest are ``Runner.run``'s)."""

    idempotent_tools: Iterable[str]
    pause_for_approvals: bool
    model_retry: Retry | None
    model_limit: Limit | None

    def in_job(self) -> dict[str, Any]:
        return {
            "idempotent_tools": frozenset(self.idempotent_tools),
            "pause_for_approvals": self.pause_for_approvals,
            "model_retry": self.model_retry,
            "model_limit": self.model_limit,
        }


def _split(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[RunContext | None, Agent[Any], Any, str | None, StoreLike]:
    """``(ctx, starting_agent, input, run_id, store)`` of a call; pops them from ``kwargs``.

    ``ctx`` is the one given first, else (without ``run_id``) the running job's; None means
    a standalone run under ``run_id``.

    Raises:
        TypeError: the call fits none of the forms of :class:`DurableRunner`.
    """
    rest = list(args)
    ctx = rest.pop(0) if rest and isinstance(rest[0], RunContext) else None
    agent = rest.pop(0) if rest else kwargs.pop("starting_agent", None)
    input = rest.pop(0) if rest else kwargs.pop("input", None)
    if rest or not isinstance(agent, Agent) or input is None:
        raise TypeError(f"{_USAGE}; got positional arguments {[type(a).__name__ for a in args]}")
    run_id, store = kwargs.pop("run_id", None), kwargs.pop("store", None)
    if ctx is not None and (run_id is not None or store is not None):
        raise TypeError(
            "with the job's ctx the agent's calls are steps of the job's run: pass no "
            "run_id= or store="
        )
    if ctx is None and run_id is None:
        if store is not None:
            raise TypeError(f"store= without run_id=: {_USAGE}")
        ctx = current_run_context()
        if ctx is None:
            raise TypeError(
                "DurableRunner.run was called outside any @afk.durable job and without "
                "run_id=...: inside a job it makes each call a step of the job's run; "
                "outside one give the run_id under which the agent run is created and "
                "found again after a crash"
            )
    return ctx, agent, input, run_id, store
