"""Standalone Agents SDK runs: ``DurableRunner.run_sync(agent, input, run_id=...)`` outside a job.

Such a call makes the agent run a durable run of its own. Every such run records the same
entrypoint, :data:`STANDALONE_ENTRYPOINT` (the
:class:`~afk_local.runner.operations.resume.JobSource` :data:`agent_runs` below), and its
arguments say which agent it runs: the ``module:name`` of a module-level ``Agent``
(``None`` when no other process can import one), the input and ``DurableRunner``'s own
options. ``afk-local resume`` and the watcher import the agent by
that name only after the run passed the trust gate (``load_job``), and only accept an
``agents.Agent`` there, never another object a crafted run names.

A call whose agent cannot be found by another process (made in a function, only in a
script run as ``__main__``) or that passes ``Runner.run`` keyword arguments (``context``,
``hooks``, ``run_config``, a ``session``: not stored) records ``extra["in_process_only"]``
with the reason; ``afk-local show`` says it and only the calling code continues the run.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import sys
from dataclasses import dataclass, field
from typing import Any

from agents import Agent, RunResult
from agents.run_context import RunContextWrapper
from pydantic import TypeAdapter, ValidationError
from pydantic_core import to_jsonable_python

from afk_local.integrations.openai_agents.in_job import run_in_job
from afk_local.runner.code.entrypoints import import_entrypoint, is_entrypoint, name_in_module
from afk_local.runner.operations.resume import JobSource, StandaloneJob
from afk_local.runner.run.durable_function import DurableFunction
from afk_local.runner.run.run_context import RunContext
from afk_local.runner.time.limits import Limit
from afk_local.runner.time.retry import Retry
from afk_local.storage.store import StoreLike

__all__ = ["AGENT_RUN_KIND", "STANDALONE_ENTRYPOINT", "Standalone", "agent_runs"]

AGENT_RUN_KIND = "openai-agents"
"""``RunMeta.extra["kind"]`` of a standalone ``DurableRunner`` run."""

STANDALONE_ENTRYPOINT = f"{__name__}:agent_runs"
"""The entrypoint every standalone run records (the :data:`agent_runs` job source)."""

_STORED_OPTIONS = frozenset({"max_turns"})
"""``Runner.run`` keyword arguments kept in the run (plain data), so another process has them."""


@dataclass
class _Call:
    """What a standalone call hands its job in this process (never stored)."""

    agent: Agent[Any]
    kwargs: dict[str, Any] = field(default_factory=dict)
    in_process_only: str | None = None
    result: RunResult | None = None
    model_retry: Retry | None = None
    model_limit: Limit | None = None


_call: contextvars.ContextVar[_Call | None] = contextvars.ContextVar(
    "afk_local_openai_agents_call", default=None
)


def _in_process_only() -> str | None:
    call = _call.get()
    return call.in_process_only if call is not None else None


async def _agent_run(
    ctx: RunContext, agent: str | None, input: Any, options: dict[str, Any]
) -> dict[str, Any]:
    """The body of a standalone run: the agent (this call's, or imported by name) on ``input``."""
    call = _call.get()
    if call is not None:
        found, kwargs = call.agent, dict(call.kwargs)
        kwargs.update(model_retry=call.model_retry, model_limit=call.model_limit)
    else:
        found, kwargs = _import_agent(ctx.run_id, agent), {}
    kwargs.update({k: v for k, v in options.items() if k in _STORED_OPTIONS})
    result = await run_in_job(
        ctx,
        found,
        input,
        idempotent_tools=options.get("idempotent_tools", ()),
        pause_for_approvals=bool(options.get("pause_for_approvals", True)),
        **kwargs,
    )
    if call is not None:
        call.result = result
    return {
        "final_output": to_jsonable_python(result.final_output),
        "last_agent": result.last_agent.name,
    }


_agent_run.__qualname__ = _agent_run.__name__ = "agent_runs"
_JOB = StandaloneJob(_agent_run, kind=AGENT_RUN_KIND, in_process_only=_in_process_only)


class Standalone(JobSource):
    """The :class:`JobSource` of every standalone run (:data:`agent_runs`)."""

    def durable_job(self, entrypoint: str) -> DurableFunction[Any]:
        """The job of the standalone runs (one for all: the run's arguments name the agent)."""
        return _JOB


agent_runs = Standalone()
"""What :data:`STANDALONE_ENTRYPOINT` names: ``afk-local resume`` asks it for the job."""


def _import_agent(run_id: str, name: str | None) -> Agent[Any]:
    """The module-level ``Agent`` a run names (the run passed the trust gate before this)."""
    if name is None or not is_entrypoint(name):
        raise TypeError(f"run {run_id!r} names no importable agent ({name!r})")
    agent: Agent[Any] = import_entrypoint(
        run_id,
        name,
        unimportable_hint="the agent is not defined at the top level of an importable module",
        accept=(Agent,),
        accept_name="an agents.Agent",
    )
    return agent


def find_agent(agent: Agent[Any]) -> str | None:
    """Where another process finds ``agent``: ``"module:name"`` at a module's top level, or None.

    The calling module is looked at first, then every imported module but ``__main__``
    (a script's agent imported from a module is found there).
    """
    caller = _calling_module()
    names = [caller] if caller and caller != "__main__" else []
    names += [n for n in list(sys.modules) if n not in (caller, "__main__")]
    for module_name in names:
        if module_name.startswith(("agents.", "afk_local.", "openai.")):
            continue
        found = name_in_module(agent, module_name)
        if found is not None:
            return found
    return None


def _calling_module() -> str | None:
    """``__name__`` of the first caller outside this integration (the one calling run_sync)."""
    frame = inspect.currentframe()
    package = __name__.rpartition(".")[0]
    while frame is not None:
        name = frame.f_globals.get("__name__")
        if not (isinstance(name, str) and name.startswith(package)):
            if isinstance(name, str) and name.startswith("asyncio"):
                frame = frame.f_back
                continue
            return name if isinstance(name, str) else None
        frame = frame.f_back
    return None


def standalone_call(
    agent: Agent[Any],
    input: Any,
    *,
    store: StoreLike,
    idempotent_tools: frozenset[str],
    pause_for_approvals: bool,
    kwargs: dict[str, Any],
    model_retry: Retry | None = None,
    model_limit: Limit | None = None,
) -> tuple[DurableFunction[Any], tuple[Any, ...], _Call]:
    """The job, its arguments and the in-process call of a standalone run of ``agent``.

    ``model_retry`` and ``model_limit`` are not stored (a ``Retry`` holds exception
    types): a run given one is continued by the calling code only.
    """
    found = find_agent(agent)
    unstored = sorted(k for k in kwargs if k not in _STORED_OPTIONS)
    unstored += [
        name
        for name, value in (("model_retry", model_retry), ("model_limit", model_limit))
        if value is not None
    ]
    reason = None
    if found is None:
        reason = (
            f"its agent {agent.name!r} is not at the top level of an importable module (made "
            "in a function, or in a script run as __main__), so no other process can find "
            "it: call DurableRunner.run_sync(agent, input, run_id=...) again from that code, "
            "or define the Agent in a module"
        )
    elif unstored:
        reason = (
            f"it was started with Runner.run arguments ({', '.join(unstored)}) that are not "
            "stored: call DurableRunner.run_sync(agent, input, run_id=..., ...) again with them"
        )
    options = {
        "idempotent_tools": sorted(idempotent_tools),
        "pause_for_approvals": pause_for_approvals,
        **{k: v for k, v in kwargs.items() if k in _STORED_OPTIONS},
    }
    plain_input = to_jsonable_python(input)
    job = _JOB.with_store(store) if store is not None else _JOB
    call = _Call(agent, kwargs, reason, model_retry=model_retry, model_limit=model_limit)
    return job, (found, plain_input, options), call


def set_call(call: _Call) -> contextvars.Token[_Call | None]:
    """Hand ``call`` to the job body this process runs next (reset with the token)."""
    return _call.set(call)


def reset_call(token: contextvars.Token[_Call | None]) -> None:
    """Undo :func:`set_call`."""
    _call.reset(token)


def result_of(call: _Call, stored: Any, agent: Agent[Any], input: Any) -> RunResult:
    """The call's live ``RunResult``; for a run that finished before, one rebuilt from its result.

    A rebuilt result has ``final_output`` (validated against the last agent's
    ``output_type``) and ``last_agent``; its ``new_items`` and ``raw_responses`` are empty
    (the stored run has them: ``afk-local inspect RUN --conversation``).
    """
    if call.result is not None:
        return call.result
    stored = stored if isinstance(stored, dict) else {}
    last = _agent_named(agent, str(stored.get("last_agent", agent.name))) or agent
    output = stored.get("final_output")
    output_type = last.output_type
    if isinstance(output_type, type) and output_type is not str:
        with contextlib.suppress(ValidationError, TypeError):  # else kept as stored JSON data
            output = TypeAdapter(output_type).validate_python(output)
    return RunResult(
        input=input,
        new_items=[],
        raw_responses=[],
        final_output=output,
        input_guardrail_results=[],
        output_guardrail_results=[],
        tool_input_guardrail_results=[],
        tool_output_guardrail_results=[],
        context_wrapper=RunContextWrapper(context=None),
        _last_agent=last,
    )


def _agent_named(agent: Agent[Any], name: str) -> Agent[Any] | None:
    """The agent called ``name`` among ``agent`` and those it hands off to (transitively)."""
    seen: set[int] = set()
    todo: list[Any] = [agent]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if current.name == name:
            return current  # type: ignore[no-any-return]
        for target in current.handoffs:
            ref = target if isinstance(target, Agent) else None
            if ref is None and getattr(target, "_agent_ref", None) is not None:
                ref = target._agent_ref()
            if isinstance(ref, Agent):
                todo.append(ref)
    return None
