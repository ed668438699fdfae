"""Durable functions: ``@afk.durable``, :class:`RunContext`, ``afk.resume``.

A durable function is a plain (sync or async) function whose first parameter
is a :class:`RunContext`. ``job.run(...)`` records it as a run; when the
process dies, ``job.run(..., run_id=...)`` or ``afk.resume(run_id)`` calls the
function again **from the top**, with:

- ``ctx.state`` restored from the newest ``runtime_state`` checkpoint,
- every finished ``ctx.step`` replayed from the effect journal (not executed),
- every ``ctx.iterate`` skipping the items already done,
- every answered ``ctx.pause`` returning its recorded input.

Example:
    >>> import afk_local as afk
    >>> @afk.durable(store="/tmp/afk-doc-runner")
    ... def total(ctx, numbers):
    ...     ctx.state.setdefault("sum", 0)
    ...     for n in ctx.iterate(numbers, progress=False):
    ...         ctx.state["sum"] += ctx.step("square", lambda x: x * x, n)
    ...     return ctx.state["sum"]
    >>> total.run([1, 2, 3])
    14

The pieces live in their own modules: :mod:`afk_local.durable_function` (the
decorator and one attempt of a run), :mod:`afk_local.run_context` (``ctx``),
:mod:`afk_local.versions` (code changes, migrations), :mod:`afk_local.stopping`
(SIGTERM). This module continues and cancels runs by id, and re-exports those
names so ``afk_local.runner.X`` keeps working.
"""

from __future__ import annotations

import asyncio
from typing import Any

from afk_local.durable_function import (
    DurableFunction,
    durable,
    registered,
    run_coroutine,
    settled,
)
from afk_local.entrypoints import import_entrypoint
from afk_local.errors import AfkLocalError, EntrypointError
from afk_local.records import RunMeta, RunStatus
from afk_local.run_context import NO_INPUT, RunContext
from afk_local.stopping import defer_stop, sigterm_exits
from afk_local.store import StoreLike, as_store
from afk_local.versions import CodeChangedWarning, code_fingerprint, migration


def is_agent_run(meta: RunMeta) -> bool:
    """True for runs made by :class:`~afk_local.AgentRunner` (``extra["kind"] == "agent"``).

    Agent runs made before the kind was recorded are recognised by ``extra["agent"]``.
    """
    kind = meta.extra.get("kind")
    if kind is not None:
        return bool(kind == "agent")
    return meta.entrypoint is None and "agent" in meta.extra


def load_entrypoint(entrypoint: str | None, run_id: str = "?") -> DurableFunction[Any]:
    """The durable function named ``module:qualname`` (this process's registry first)."""
    if entrypoint is None:
        raise EntrypointError(
            run_id,
            None,
            "the run was not started by an @afk.durable job or a rebuildable agent (a "
            "StateCheckpoint, a LangGraph thread, a plain store.create run): only the code "
            "that writes it can continue it",
        )
    found = registered(entrypoint)
    if found is not None:
        return found
    obj = import_entrypoint(
        run_id,
        entrypoint,
        unimportable_hint=(
            "it was defined in a script run as __main__, a notebook or inside a function, "
            "which another process cannot import. Resume it from the same script/notebook with "
            "job.run(run_id=...), or move the job into an importable module"
        ),
    )
    if not isinstance(obj, DurableFunction):
        raise EntrypointError(run_id, entrypoint, "it is not an @afk.durable function")
    return obj


def resume(run_id: str, *, store: StoreLike = None, input: Any = None, in_doubt: Any = None) -> Any:
    """Continue run ``run_id``: re-import its job and run it (see :meth:`DurableFunction.run`).

    Agent runs (:func:`is_agent_run`) are continued by
    :func:`afk_local.agent_rebuild.resume_agent`, which rebuilds the ``Agent`` from the
    run's entrypoint and returns the :class:`~afk_local.AgentResult` (completed,
    failed or paused: it does not raise for those).

    Args:
        store: the run's store (default ``$AFK_LOCAL_ROOT`` else ``./.afk``).
        input: for a paused run, the value its ``ctx.pause`` returns; a paused run
            given no input raises :class:`~afk_local.RunPaused` and changes nothing.
        in_doubt: policy for steps a crash left in doubt (``"retry"`` once you checked).
    """
    the_store = as_store(store)
    meta = the_store.read_meta(run_id)
    if is_agent_run(meta):
        # Imported here, not at the top: agent_rebuild imports this module.
        from afk_local.agent_rebuild import resume_agent  # noqa: PLC0415

        return resume_agent(run_id, store=the_store, input=input, in_doubt=in_doubt)
    value = NO_INPUT if input is None else input
    done = settled(the_store, meta, value)  # completed/paused/cancelled: no import needed
    if done is not None:
        return done.result
    job = load_entrypoint(meta.entrypoint, run_id)
    if job.is_async:
        return run_coroutine(
            job._async(the_store, run_id, (), {}, input_value=value, in_doubt=in_doubt)
        )
    return job._sync(the_store, run_id, (), {}, input_value=value, in_doubt=in_doubt)


async def aresume(
    run_id: str, *, store: StoreLike = None, input: Any = None, in_doubt: Any = None
) -> Any:
    """The async form of :func:`resume` (an agent run is resumed in a worker thread)."""
    the_store = as_store(store)
    meta = the_store.read_meta(run_id)
    if is_agent_run(meta):
        return await asyncio.to_thread(
            resume, run_id, store=the_store, input=input, in_doubt=in_doubt
        )
    value = NO_INPUT if input is None else input
    done = settled(the_store, meta, value)
    if done is not None:
        return done.result
    job = load_entrypoint(meta.entrypoint, run_id)
    return await job._async(the_store, run_id, (), {}, input_value=value, in_doubt=in_doubt)


def resume_run(run_id: str, store: StoreLike = None, input: Any = None) -> Any:
    """What ``python -m afk_local resume RUN`` calls: :func:`resume` with positional store.

    Dispatches on the run's kind. A durable job's run returns its result (or
    raises what the job raised, or :class:`~afk_local.RunPaused`); an agent run
    goes to :func:`afk_local.agent_rebuild.resume_agent_run`, which speaks the same
    terms: the final text, ``RunPaused``, or ``AgentFailedError`` for a failed run.
    """
    the_store = as_store(store)
    if is_agent_run(the_store.read_meta(run_id)):
        from afk_local.agent_rebuild import resume_agent_run  # noqa: PLC0415 - it imports runner

        return resume_agent_run(run_id, the_store, input)
    return resume(run_id, store=the_store, input=input)


def cancel(run_id: str, *, store: StoreLike = None, reason: str = "cancelled") -> None:
    """Make run ``run_id`` terminal (``cancelled``); it is never resumed again.

    Raises:
        RunLockedError: the run is running in some process right now.
        ValueError: it already completed.
    """
    the_store = as_store(store)
    meta = the_store.read_meta(run_id)
    if meta.status is RunStatus.CANCELLED:
        return
    if meta.status is RunStatus.COMPLETED:
        raise ValueError(f"run {run_id!r} already completed; there is nothing to cancel")
    with the_store.resume_writer(run_id) as run:
        run.cancel(reason)
        run.update_meta(extra={**run.meta.extra, "cancel_reason": reason})


__all__ = [
    "AfkLocalError",
    "CodeChangedWarning",
    "DurableFunction",
    "RunContext",
    "aresume",
    "as_store",
    "cancel",
    "code_fingerprint",
    "defer_stop",
    "durable",
    "is_agent_run",
    "load_entrypoint",
    "migration",
    "resume",
    "resume_run",
    "sigterm_exits",
]
