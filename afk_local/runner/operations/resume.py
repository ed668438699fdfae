"""Continuing a durable job by run id: find its function, run it again from the top.

``afk.resume(run_id)`` (:mod:`afk_local.agent.resume`) comes here for runs made by
``@afk.durable`` functions; agent runs go to :mod:`afk_local.agent.rebuild`.
:func:`load_job` is the one place that finds a run's code: this process's
registry, an import of ``module:qualname``, or, in a process started to continue
the run (``reenter=True``: ``afk-local resume``, the watcher's child), the job's
recorded working directory, ``sys.path`` and script (:mod:`.reentry`).
"""

from __future__ import annotations

import abc
import copy
import logging
from collections.abc import Callable, Mapping
from typing import Any

from afk_local.errors import AfkLocalError, EntrypointError
from afk_local.runner.code.entrypoints import import_entrypoint
from afk_local.runner.code.origin import IN_PROCESS_KEY, UNRESUMABLE_KEY, cannot_resume, origin_of
from afk_local.runner.operations.reentry import enter_origin, run_main
from afk_local.runner.run.durable_function import (
    DurableFunction,
    registered,
    registered_in,
    run_coroutine,
    settled,
)
from afk_local.runner.run.run_context import NO_INPUT
from afk_local.storage.format.records import RunMeta
from afk_local.storage.store import Store
from afk_local.storage.trust import TrustedRun, require_trusted_run

log = logging.getLogger("afk_local")


class JobSource(abc.ABC):
    """An object a run's entrypoint may name in place of an ``@afk.durable`` function.

    A wrapper that runs something durably without the user writing a job (a framework's
    agent wrapped by an integration) subclasses it: :func:`load_entrypoint` accepts a
    module-level instance and asks it for the job. Only subclasses are accepted, so a
    crafted ``run.meta`` still cannot name an arbitrary object.
    """

    @abc.abstractmethod
    def durable_job(self, entrypoint: str) -> DurableFunction[Any]:
        """The durable job whose runs record ``entrypoint`` (this object's module-level name)."""


class StandaloneJob(DurableFunction[Any]):
    """The durable job behind an integration's standalone agent runs (``run_id=`` outside
    a job): its new runs record ``extra["kind"]`` and, when the call in hand cannot be
    continued by another process, ``extra["in_process_only"]`` with the reason.

    Args:
        fn: the job body.
        kind: what ``extra["kind"]`` says the run is (``"pydantic-ai"``).
        in_process_only: asked once per new run: why only this process can continue
            the call it is making, or None.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        kind: str,
        in_process_only: Callable[[], str | None],
    ) -> None:
        super().__init__(fn)
        self.kind = kind
        self.in_process_only = in_process_only

    def _new_extra(self, tags: Mapping[str, str] | None) -> dict[str, Any]:
        extra = super()._new_extra(tags)
        extra["kind"] = self.kind
        reason = self.in_process_only()
        if reason:
            extra[IN_PROCESS_KEY] = reason
        return extra


def load_entrypoint(entrypoint: str | None, run_id: str = "?") -> DurableFunction[Any]:
    """The durable function named ``module:qualname`` (this process's registry first).

    The name may also be that of a :class:`JobSource` (which gives the job).
    """
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
    job: DurableFunction[Any] | JobSource = import_entrypoint(
        run_id,
        entrypoint,
        unimportable_hint=(
            "it was defined in a script run as __main__, a notebook or inside a function, "
            "which another process cannot import. Resume it from the same script/notebook with "
            "job.run(run_id=...), or move the job into an importable module"
        ),
        accept=(DurableFunction, JobSource),
        accept_name="an @afk.durable function",
    )
    if isinstance(job, JobSource):
        return job.durable_job(entrypoint)
    return job


def load_job(trusted: TrustedRun, *, reenter: bool = False) -> DurableFunction[Any]:
    """The durable function that continues a run that passed the trust gate.

    Found in this process's registry first, else imported by its entrypoint (which
    must name an ``@afk.durable`` function). With ``reenter`` (only in a process
    started to continue this one run: it changes the working directory and
    ``sys.path``), the process first goes back to where the job ran, and a job
    defined in a script is found by running the script again up to its first
    durable run. Importing a module or running a script is executing what the
    store names: it takes a :class:`~afk_local.storage.trust.TrustedRun`, which only
    :func:`~afk_local.storage.trust.require_trusted_run` makes.

    Raises:
        EntrypointError: the job cannot be found here; the message says why.
    """
    meta = trusted.meta
    run_id, entrypoint = meta.run_id, meta.entrypoint
    if entrypoint is not None:
        found = registered(entrypoint)
        if found is not None:
            return found
    reason = cannot_resume(meta, recorded=False)  # a recorded reason: try again
    if reason is not None:
        raise EntrypointError(run_id, entrypoint, reason)
    assert entrypoint is not None
    if reenter:
        enter_origin(meta)
        if entrypoint.startswith("__main__:"):
            run_main(meta)
            found = registered(entrypoint)
            if found is None:
                raise EntrypointError(run_id, entrypoint, _not_defined(meta), gone=True)
            return found
    elif entrypoint.startswith("__main__:"):
        raise EntrypointError(
            run_id,
            entrypoint,
            "it was defined in a script run as __main__, which this process cannot import: "
            f"continue it with `afk-local resume {run_id}` (it runs the script again up to "
            "the job), or run the script itself again with the same run id",
        )
    return load_entrypoint(entrypoint, run_id)


def _not_defined(meta: RunMeta) -> str:
    """What to do when running a script job's script again did not define its job."""
    origin = origin_of(meta)
    where = (origin.script or origin.module) if origin is not None else None
    qualname = (meta.entrypoint or "").partition(":")[2]
    now = registered_in("__main__")
    defines = f"it defines {', '.join(now)} now" if now else "it defines no @afk.durable job now"
    return (
        f"{where or 'its script'} no longer defines the job {qualname} ({defines}: renamed "
        f"or removed?): give it its old name again, then resume the run; or cancel it "
        f"(`afk-local cancel {meta.run_id}`) and start a new one"
    )


def record_unresumable(store: Store, run_id: str, reason: str) -> None:
    """Mark the run unresumable with ``reason`` (its code is gone) so nothing retries it blindly.

    ``runs`` and ``show`` print the reason and the watcher leaves the run alone
    (:func:`~afk_local.runner.code.origin.cannot_resume`); the next attempt that starts
    clears it. Best effort: a run another process holds keeps its meta.
    """
    try:
        with store.resume_writer(run_id, lock_timeout=0, new_attempt=False) as run:
            if run.meta.status.expects_owner:
                run.update_meta(extra={**run.meta.extra, UNRESUMABLE_KEY: reason})
    except (AfkLocalError, OSError) as exc:
        log.warning("run %s: could not record that it cannot be resumed: %s", run_id, exc)


def _absolute(store: Store) -> Store:
    """``store`` with an absolute root, so that a change of working directory keeps it."""
    if store.root.is_absolute():
        return store
    rooted = copy.copy(store)
    rooted.root = store.root.absolute()
    return rooted


def resume_job(
    store: Store,
    run_id: str,
    *,
    input: Any = None,
    in_doubt: Any = None,
    reenter: bool = False,
    pause_seq: int | None = None,
) -> Any:
    """Continue the durable job's run ``run_id`` (see :func:`afk_local.resume`).

    ``reenter``: this process was started to continue this run (see :func:`load_job`).
    ``pause_seq``: the pause ``input`` answers (:mod:`afk_local.runner.run.answers`).

    Raises:
        UntrustedStoreError: the trust gate refused the run (nothing was imported or run).
        EntrypointError: its entrypoint is not an ``@afk.durable`` function here.
    """
    value = NO_INPUT if input is None else input
    done = settled(store, store.read_meta(run_id), value, pause_seq)  # answered from disk
    if done is not None:
        return done.result
    trusted = require_trusted_run(store, run_id, from_origin=True)  # before anything runs
    if reenter:
        store = _absolute(store)
    try:
        job = load_job(trusted, reenter=reenter)
    except EntrypointError as exc:
        if reenter and exc.gone:  # where the run ran, its code is gone: say so, retry no more
            record_unresumable(store, run_id, exc.reason)
        raise
    options = {"input_value": value, "in_doubt": in_doubt, "pause_seq": pause_seq}
    if job.is_async:
        return run_coroutine(job._async(store, run_id, (), {}, **options))
    return job._sync(store, run_id, (), {}, **options)


async def aresume_job(
    store: Store,
    run_id: str,
    *,
    input: Any = None,
    in_doubt: Any = None,
    pause_seq: int | None = None,
) -> Any:
    """The async form of :func:`resume_job`."""
    value = NO_INPUT if input is None else input
    done = settled(store, store.read_meta(run_id), value, pause_seq)
    if done is not None:
        return done.result
    job = load_job(require_trusted_run(store, run_id, from_origin=True))
    return await job._async(
        store, run_id, (), {}, input_value=value, in_doubt=in_doubt, pause_seq=pause_seq
    )


__all__ = [
    "JobSource",
    "aresume_job",
    "load_entrypoint",
    "load_job",
    "record_unresumable",
    "resume_job",
]
