""":class:`DurableAgent`: a pydantic-ai agent whose runs survive a kill, in a job or on their own.

Inside an ``@afk.durable`` job, ``run_sync(ctx, prompt)`` makes each model request and tool
call a step of that job (:mod:`.steps`). Outside one, ``run_sync(prompt, run_id=...)`` makes
the agent run a durable run of its own: the run's job is this agent (its entrypoint is the
``module:name`` of the ``DurableAgent``), its argument the prompt, its result pydantic-ai's
serialized ``AgentRunResult``.
"""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, overload

from pydantic import TypeAdapter
from pydantic.errors import PydanticSchemaGenerationError
from pydantic_ai import DeferredToolRequests, DeferredToolResults
from pydantic_ai.agent import AbstractAgent, AgentRunResult

from afk_local.integrations.pydantic_ai.steps import APPROVAL_PAUSE, Journaled, approval_results
from afk_local.runner.code.entrypoints import is_entrypoint, name_in_module
from afk_local.runner.operations.resume import JobSource, StandaloneJob
from afk_local.runner.run.current import current_run_context
from afk_local.runner.run.durable_function import DurableFunction
from afk_local.runner.run.run_context import RunContext
from afk_local.runner.time.limits import Limit
from afk_local.runner.time.retry import Retry
from afk_local.storage.store import StoreLike

__all__ = ["AGENT_RUN_KIND", "DurableAgent"]

DepsT = TypeVar("DepsT")
OutputT = TypeVar("OutputT")

AGENT_RUN_KIND = "pydantic-ai"
"""``RunMeta.extra["kind"]`` of a standalone ``DurableAgent`` run."""

_NOT_STREAMED = (
    "DurableAgent journals run() and run_sync() only: a streamed run ({method}) is not "
    "journaled, so a kill would lose it. Call run_sync()/run(), or use the wrapped agent "
    "(durable_agent.wrapped.{method}) knowing that it is not durable"
)


@dataclass
class _Call:
    """What a standalone call hands its job in this process (never stored)."""

    kwargs: dict[str, Any] = field(default_factory=dict)
    in_process_only: str | None = None


_call: contextvars.ContextVar[_Call | None] = contextvars.ContextVar(
    "afk_local_pydantic_ai_call", default=None
)


def _in_process_only() -> str | None:
    call = _call.get()
    return call.in_process_only if call is not None else None


class DurableAgent(JobSource, Generic[DepsT, OutputT]):
    """A pydantic-ai agent whose runs survive a kill, inside an ``@afk.durable`` job or alone.

    Every model request is a journaled step (replayed on resume, asked again if a crash
    cut it short: a request is a read). Every tool call is a journaled step keyed by its
    tool call id: replayed when it finished; when a crash cut it short it is *in doubt*,
    and the resume stops with ``EffectInDoubtError`` unless the tool is named in
    ``idempotent_tools`` (then it is called again with the same
    :func:`tool_idempotency_key`).

    Two ways to call it:

    - in a job: ``durable_agent.run_sync(prompt, **kwargs)``, as pydantic-ai's own
      ``run_sync`` (it finds the job it runs in), or ``run_sync(ctx, prompt, **kwargs)``:
      the calls are steps of the job's run;
    - alone: ``durable_agent.run_sync(prompt, run_id="r1", store=None, **kwargs)``: the
      agent run is a run of its own, created or continued under ``run_id``; a finished
      run returns its stored result without calling the model. Another process
      (``afk-local resume``, the watcher) can continue it when this object is defined at
      the top level of an importable module and no other keyword arguments were given;
      otherwise ``afk-local show`` says why only your code can.

    An ``event_stream_handler`` (or an ``on_event`` hook) is called as pydantic-ai calls
    it: the model requests are streamed, and journaled as any; a replayed answer reaches
    it whole (its parts, no deltas), with the tool events of the replayed results. It
    runs again on every attempt: keep it to showing or logging what happens.

    A run that ends with tool calls waiting for approval (tools with
    ``requires_approval=True``, ``DeferredToolRequests`` in the agent's output types)
    pauses (``ctx.pause``, kind ``"approval"``): answer it from any process with
    ``afk-local resume RUN --input '{"CALL_ID": true}'`` (``false``, or a message, denies
    the call) and the agent continues with those answers.

    Args:
        agent: the pydantic-ai agent to run; it is not changed.
        idempotent_tools: names of tools that may be called again after a crash.
        pause_for_approvals: False returns ``DeferredToolRequests`` to the caller instead.
        entrypoint: ``"module:name"`` of this object, for standalone runs that another
            process continues. Default: its name at the top level of the module that
            made it, when it has one.
        model_retry: an ``afk.Retry`` for each model request: a failed try is journaled
            with its error, the backoff is a durable sleep (``ctx.step(..., retry=)``).
        model_limit: an ``afk.Limit`` each model request waits for a place under (shared
            by every process of the store).
    """

    def __init__(
        self,
        agent: AbstractAgent[DepsT, OutputT],
        *,
        idempotent_tools: Iterable[str] = (),
        pause_for_approvals: bool = True,
        entrypoint: str | None = None,
        model_retry: Retry | None = None,
        model_limit: Limit | None = None,
    ) -> None:
        if entrypoint is not None and not is_entrypoint(entrypoint):
            raise ValueError(
                f"DurableAgent(entrypoint={entrypoint!r}): expected 'module:name' of the "
                "module-level DurableAgent (e.g. 'mypkg.agents:durable_agent')"
            )
        self._agent = agent
        self._idempotent_tools = frozenset(idempotent_tools)
        self._pause_for_approvals = pause_for_approvals
        self._entrypoint = entrypoint
        self._model_retry = model_retry
        self._model_limit = model_limit
        self._defined_in = _constructing_module()
        self._jobs: dict[str, StandaloneJob] = {}

    @property
    def wrapped(self) -> AbstractAgent[DepsT, OutputT]:
        """The pydantic-ai agent this wraps."""
        return self._agent

    # -- run / run_sync ----------------------------------------------------------------

    @overload
    async def run(
        self, ctx: RunContext, user_prompt: str | None = None, /, **kwargs: Any
    ) -> AgentRunResult[OutputT]: ...

    @overload
    async def run(
        self,
        user_prompt: str | None = None,
        /,
        *,
        run_id: str,
        store: StoreLike = None,
        **kwargs: Any,
    ) -> AgentRunResult[OutputT]: ...

    async def run(
        self, first: Any = None, second: Any = None, /, **kwargs: Any
    ) -> AgentRunResult[OutputT]:
        """``agent.run(user_prompt, **kwargs)``, durable.

        ``run(ctx, prompt, **kwargs)`` inside an ``@afk.durable`` job (each model and tool
        call a step of ``ctx``); ``run(prompt, run_id=..., store=None, **kwargs)`` on its
        own (see the class docstring). Tool calls waiting for approval pause the run.
        """
        ctx, user_prompt, run_id, store = _split(first, second, kwargs)
        if ctx is None:
            job, call = self._standalone(run_id, store, kwargs)
            token = _call.set(call)
            try:
                stored = await job.arun(user_prompt, run_id=run_id)
            finally:
                _call.reset(token)
            return self._result(stored)
        capabilities = [*(kwargs.pop("capabilities", None) or ()), self._capability(ctx)]
        result: AgentRunResult[OutputT] = await self._agent.run(
            user_prompt, capabilities=capabilities, **kwargs
        )
        while (answers := self._approvals(ctx, result)) is not None:
            result = await self._agent.run(
                None, capabilities=capabilities, **self._continuation(kwargs, result, answers)
            )
        return result

    @overload
    def run_sync(
        self, ctx: RunContext, user_prompt: str | None = None, /, **kwargs: Any
    ) -> AgentRunResult[OutputT]: ...

    @overload
    def run_sync(
        self,
        user_prompt: str | None = None,
        /,
        *,
        run_id: str,
        store: StoreLike = None,
        **kwargs: Any,
    ) -> AgentRunResult[OutputT]: ...

    def run_sync(
        self, first: Any = None, second: Any = None, /, **kwargs: Any
    ) -> AgentRunResult[OutputT]:
        """``agent.run_sync(user_prompt, **kwargs)``, durable.

        ``run_sync(ctx, prompt, **kwargs)`` inside an ``@afk.durable`` job (each model and
        tool call a step of ``ctx``); ``run_sync(prompt, run_id=..., store=None,
        **kwargs)`` on its own (see the class docstring). Tool calls waiting for approval
        pause the run.
        """
        ctx, user_prompt, run_id, store = _split(first, second, kwargs)
        if ctx is None:
            job, call = self._standalone(run_id, store, kwargs)
            token = _call.set(call)
            try:
                stored = job.run(user_prompt, run_id=run_id)
            finally:
                _call.reset(token)
            return self._result(stored)
        capabilities = [*(kwargs.pop("capabilities", None) or ()), self._capability(ctx)]
        result: AgentRunResult[OutputT] = self._agent.run_sync(
            user_prompt, capabilities=capabilities, **kwargs
        )
        while (answers := self._approvals(ctx, result)) is not None:
            result = self._agent.run_sync(
                None, capabilities=capabilities, **self._continuation(kwargs, result, answers)
            )
        return result

    def run_stream(self, *args: Any, **kwargs: Any) -> Any:
        """Not journaled: raises ``NotImplementedError`` (use ``run``/``run_sync``)."""
        raise NotImplementedError(_NOT_STREAMED.format(method="run_stream"))

    def run_stream_events(self, *args: Any, **kwargs: Any) -> Any:
        """Not journaled: raises ``NotImplementedError`` (use ``run``/``run_sync``)."""
        raise NotImplementedError(_NOT_STREAMED.format(method="run_stream_events"))

    def run_stream_sync(self, *args: Any, **kwargs: Any) -> Any:
        """Not journaled: raises ``NotImplementedError`` (use ``run``/``run_sync``)."""
        raise NotImplementedError(_NOT_STREAMED.format(method="run_stream_sync"))

    def iter(self, *args: Any, **kwargs: Any) -> Any:
        """Not journaled: raises ``NotImplementedError`` (use ``run``/``run_sync``)."""
        raise NotImplementedError(_NOT_STREAMED.format(method="iter"))

    # -- standalone runs ---------------------------------------------------------------

    def find_entrypoint(self) -> str | None:
        """Where another process finds this object: ``"module:name"``, or None.

        ``entrypoint`` when given; else the name this very object has at the top level
        of the module that made it (``"__main__:..."`` for a script or a notebook);
        else None (made inside a function).
        """
        if self._entrypoint is not None:
            return self._entrypoint
        return name_in_module(self, self._defined_in)

    def durable_job(self, entrypoint: str) -> DurableFunction[Any]:
        """The durable job of this agent's standalone runs, recorded as ``entrypoint``.

        ``afk-local resume`` and the watcher call it after importing this object by the
        name a run recorded; the job runs the prompt stored in the run.
        """
        job = self._jobs.get(entrypoint)
        if job is None:

            async def agent_run(ctx: RunContext, user_prompt: str | None) -> dict[str, Any]:
                call = _call.get()
                result = await self.run(ctx, user_prompt, **(call.kwargs if call else {}))
                return _result_adapter(self._agent).dump_python(result, mode="json")  # type: ignore[no-any-return]

            module, _, qualname = entrypoint.partition(":")
            agent_run.__module__, agent_run.__qualname__ = module, qualname
            job = self._jobs[entrypoint] = StandaloneJob(
                agent_run, kind=AGENT_RUN_KIND, in_process_only=_in_process_only
            )
        return job

    def _standalone(
        self, run_id: str | None, store: StoreLike, kwargs: dict[str, Any]
    ) -> tuple[DurableFunction[Any], _Call]:
        if run_id is None:
            raise TypeError(
                "DurableAgent.run_sync outside an @afk.durable job needs run_id=...: the "
                "id under which the run is created, and found again after a crash (inside "
                "a job it finds the job by itself, or takes the job's ctx first)"
            )
        entrypoint = self.find_entrypoint()
        reason = None
        if entrypoint is None:
            entrypoint = f"{self._defined_in or '__main__'}:<locals>.DurableAgent"
            reason = (
                "its DurableAgent was made inside a function, which no other process can "
                "reach: call durable_agent.run_sync(prompt, run_id=...) again from that "
                "code, or define the DurableAgent at module level (or give it entrypoint=)"
            )
        elif entrypoint.startswith("__main__:"):
            reason = (
                "its DurableAgent is defined in a script run as __main__ (or a notebook), "
                "which no other process can import: run the script again with the same "
                "run id, or move the DurableAgent into an importable module"
            )
        elif kwargs:
            reason = (
                "it was started with keyword arguments for the agent "
                f"({', '.join(sorted(kwargs))}) that are not stored: call "
                "durable_agent.run_sync(prompt, run_id=..., ...) again with them"
            )
        self.durable_job(entrypoint)
        job = self._jobs[entrypoint]
        return job.with_store(store) if store is not None else job, _Call(kwargs, reason)

    def _result(self, stored: Any) -> AgentRunResult[OutputT]:
        """The ``AgentRunResult`` a standalone run stored (pydantic-ai's serialized form)."""
        result: AgentRunResult[OutputT] = _result_adapter(self._agent).validate_python(stored)
        return result

    # -- in a job ----------------------------------------------------------------------

    def _approvals(
        self, ctx: RunContext, result: AgentRunResult[OutputT]
    ) -> DeferredToolResults | None:
        """Pause for the approvals a run ended with; None when it did not end that way."""
        requests = result.output
        if not (
            self._pause_for_approvals
            and isinstance(requests, DeferredToolRequests)
            and requests.approvals
            and not requests.calls  # results of external calls are the caller's to bring
        ):
            return None
        prompt = {
            "question": "approve these tool calls? answer {tool_call_id: true, false or "
            "a message saying why not}",
            "approvals": [
                {"tool_call_id": c.tool_call_id, "tool_name": c.tool_name, "args": c.args_as_dict()}
                for c in requests.approvals
            ],
        }
        while True:  # an answer that does not fit is journaled too: ask again, saying why
            answer = ctx.pause(prompt, kind=APPROVAL_PAUSE)
            try:
                return approval_results(requests, answer)
            except ValueError as exc:
                prompt = {**prompt, "error": str(exc)}

    @staticmethod
    def _continuation(
        kwargs: dict[str, Any], result: AgentRunResult[OutputT], answers: DeferredToolResults
    ) -> dict[str, Any]:
        return {
            **kwargs,
            "message_history": result.all_messages(),
            "deferred_tool_results": answers,
        }

    def _capability(self, ctx: RunContext) -> Journaled:
        if not isinstance(ctx, RunContext):
            raise TypeError(
                "DurableAgent.run takes the durable job's afk.RunContext first, "
                f"not {type(ctx).__name__}"
            )
        retry, limit = self._model_retry, self._model_limit
        return Journaled(ctx, self._idempotent_tools, model_retry=retry, model_limit=limit)


def _split(
    first: Any, second: Any, kwargs: dict[str, Any]
) -> tuple[RunContext | None, Any, str | None, StoreLike]:
    """``(ctx, user_prompt, run_id, store)`` of a call; pops ``user_prompt``/``run_id``/``store``.

    ``ctx`` is the one given first, else (without ``run_id``) the running job's; None means
    a standalone run under ``run_id``.

    Raises:
        TypeError: a second positional argument without a ctx, or ``run_id``/``store``
            inside a job.
    """
    if isinstance(first, RunContext):
        ctx, user_prompt = first, second
    elif second is not None:
        raise TypeError(
            "DurableAgent.run takes (ctx, user_prompt, **kwargs) inside an @afk.durable job, "
            f"(user_prompt, run_id=..., **kwargs) outside one; its first argument is a "
            f"{type(first).__name__}, not an afk.RunContext"
        )
    else:
        ctx, user_prompt = None, first
    if user_prompt is None:
        user_prompt = kwargs.pop("user_prompt", None)
    run_id, store = kwargs.pop("run_id", None), kwargs.pop("store", None)
    if ctx is not None and (run_id is not None or store is not None):
        raise TypeError(
            "inside an @afk.durable job the agent's calls are steps of the job's run: "
            "pass no run_id= or store= with ctx"
        )
    if ctx is None and run_id is None and store is None:
        # Called as pydantic-ai's run_sync(prompt) is, inside a job: the job's steps.
        ctx = current_run_context()
    return ctx, user_prompt, run_id, store


def _result_adapter(agent: AbstractAgent[Any, Any]) -> TypeAdapter[AgentRunResult[Any]]:
    """pydantic's adapter for this agent's ``AgentRunResult`` (``Any`` output when its
    output type is not a plain type, e.g. ``ToolOutput(...)`` or a list of types)."""
    output_type = getattr(agent, "output_type", Any)
    try:
        return TypeAdapter(AgentRunResult[output_type])  # type: ignore[valid-type]
    except (PydanticSchemaGenerationError, TypeError):
        return TypeAdapter(AgentRunResult[Any])


def _constructing_module() -> str | None:
    """``__name__`` of the first caller outside this module (the one making the DurableAgent)."""
    frame = inspect.currentframe()
    while frame is not None:
        name = frame.f_globals.get("__name__")
        if name != __name__:
            return name if isinstance(name, str) else None
        frame = frame.f_back
    return None
