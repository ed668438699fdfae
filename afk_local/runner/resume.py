"""Continuing a durable job by run id: find its function, run it again from the top.

``afk.resume(run_id)`` (:mod:`afk_local.agent.resume`) comes here for runs made by
``@afk.durable`` functions; agent runs go to :mod:`afk_local.agent.rebuild`.
"""

from __future__ import annotations

from typing import Any

from afk_local.errors import EntrypointError
from afk_local.runner.durable_function import DurableFunction, registered, run_coroutine, settled
from afk_local.runner.entrypoints import import_entrypoint
from afk_local.runner.run_context import NO_INPUT
from afk_local.storage.store import Store


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


def resume_job(store: Store, run_id: str, *, input: Any = None, in_doubt: Any = None) -> Any:
    """Continue the durable job's run ``run_id`` (see :func:`afk_local.resume`)."""
    meta = store.read_meta(run_id)
    value = NO_INPUT if input is None else input
    done = settled(store, meta, value)  # completed/paused/cancelled: no import needed
    if done is not None:
        return done.result
    job = load_entrypoint(meta.entrypoint, run_id)
    if job.is_async:
        return run_coroutine(
            job._async(store, run_id, (), {}, input_value=value, in_doubt=in_doubt)
        )
    return job._sync(store, run_id, (), {}, input_value=value, in_doubt=in_doubt)


async def aresume_job(store: Store, run_id: str, *, input: Any = None, in_doubt: Any = None) -> Any:
    """The async form of :func:`resume_job`."""
    meta = store.read_meta(run_id)
    value = NO_INPUT if input is None else input
    done = settled(store, meta, value)
    if done is not None:
        return done.result
    job = load_entrypoint(meta.entrypoint, run_id)
    return await job._async(store, run_id, (), {}, input_value=value, in_doubt=in_doubt)


__all__ = ["aresume_job", "load_entrypoint", "resume_job"]
