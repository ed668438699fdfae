"""Many durable runs on Ray (extra ``[ray]``): :func:`map_durable`.

Each item is one durable run; by default the first tasks run one item each
and later ones more while the items prove cheap (``items_per_task=N``: N runs
share each task). Ray schedules the tasks and re-runs those whose worker
process died (the task's ``max_retries``); a re-run task resumes its runs from
their last checkpoints, so finished ``ctx.step`` calls are replayed, never
repeated. Storage is a directory every worker sees
(docs/fanout.md says what that asks of a network filesystem).

Example:
    >>> import ray  # doctest: +SKIP
    >>> from afk_local.integrations.ray import map_durable  # doctest: +SKIP
    >>> ray.init(num_cpus=2)  # doctest: +SKIP
    >>> sizes = map_durable(resize, paths, store="/shared/afk")  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

try:
    import ray
    from ray.exceptions import RayError, RayTaskError
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("afk_local.integrations.ray needs Ray: pip install 'afk_local[ray]'") from exc

from afk_local.integrations.fanout import (
    ChunkOutcomes,
    ChunkPlanner,
    FanOutError,
    FanOutProgress,
    SharedDirectory,
    WorkerStore,
    check_items_per_task,
    describe_failure,
    fanout_run_ids,
    job_name,
    portable_job,
    run_task,
    run_tasks,
    run_timed_tasks,
    task_chunks,
    worker_store,
)
from afk_local.integrations.fanout_results import client_store, completed_results
from afk_local.storage.store import Store

WORKER_DEATHS = 3
"""How often Ray re-runs a task whose worker process died (Ray's own default)."""

_POLL_S = 0.2
_remote_task: Any = None
_remote_chunk: Any = None
_remote_timed: Any = None
log = logging.getLogger("afk_local")


def map_durable(
    fn: Any,
    items: Iterable[Any],
    *,
    store: Store | str | os.PathLike[str] | WorkerStore,
    run_id: Callable[[Any], str] | None = None,
    retries: int = 0,
    progress: bool = True,
    items_per_task: int | None = None,
) -> list[Any]:
    """Run ``fn(ctx, item)`` as one durable run per item on Ray; the results in item order.

    Example:
        >>> @afk.durable  # doctest: +SKIP
        ... def square(ctx, x):
        ...     return ctx.step("square", pow, x, 2)
        >>> map_durable(square, [1, 2, 3], store="/shared/afk")  # doctest: +SKIP
        [1, 4, 9]

    Uses the Ray cluster this process is connected to (``ray.init()``; without
    it, Ray starts a local one). A task whose worker process died is re-run by
    Ray (:data:`WORKER_DEATHS` times) and resumes its run from the last
    checkpoint; a run that already completed returns its stored result without
    running: the client reads it from the store and submits no task for it (a
    call over a finished fan-out does not even start Ray). Call it again after
    any failure: it finds the same runs by their ids.

    Args:
        fn: an ``@afk.durable`` job taking the item as its one argument
            (msgpack-able, since it is stored in ``run.meta``).
        items: the items, one run each.
        store: where the runs live: a :class:`~afk_local.Store` or directory that
            every worker reaches at the same path, or a
            :class:`~afk_local.integrations.fanout.WorkerStore`.
        run_id: ``run_id(item) -> str``; default ``fanout-<function name>-<index>``.
        retries: how often Ray re-runs a task whose run raised; each retry resumes
            the failed run (attempt + 1, finished steps replayed). Default 0. Ray
            counts these and worker deaths in one budget of ``3 + retries``.
        progress: one progress bar for all runs (tqdm when installed, else log lines).
        items_per_task: items per Ray task. Default (None): chosen as the fan-out goes
            (:class:`~afk_local.integrations.fanout.ChunkPlanner`): one item per task at
            first and for expensive items or short lists, more per task while items prove
            cheap, keeping two tasks per CPU for balance (``retries`` are then made inside
            the task). ``1``: always one task per item. With more than one, a
            task runs its items' runs at once, each on its own thread of the worker, so
            that their fsyncs overlap and the filesystem commits them together: for many
            small items the runs cost far less (see docs/fanout.md). Every run keeps every
            guarantee; what changes is that up to this many items run at the same time in
            one worker process (mind their memory and ``fn``'s thread safety), that a
            worker's death re-runs the whole task (its completed runs return their stored
            results; Ray does so :data:`WORKER_DEATHS` times), and that ``retries`` are
            made inside the task.

    Returns:
        Each run's result, in the order of ``items``.

    Raises:
        FanOutError: some runs failed, paused or were lost with their workers;
            it names each one's run id. Every other run completed.
    """
    if items_per_task is not None:
        check_items_per_task(items_per_task)
    job = portable_job(fn)
    items = list(items)
    ids = fanout_run_ids(job, items, run_id)
    site = worker_store(store)
    results = completed_results(client_store(store), job, items, ids)
    todo = [index for index in range(len(items)) if index not in results]
    if not todo:  # nothing left to run (or no items): no task, Ray is not even started
        return [results[index] for index in range(len(items))]
    if items_per_task is None:
        if not ray.is_initialized():
            ray.init()
        slots = int(ray.cluster_resources().get("CPU", 1))  # type: ignore[no-untyped-call]
        planner = ChunkPlanner(todo, slots)
        results.update(
            _run_planned(
                job,
                site,
                items=items,
                ids=ids,
                planner=planner,
                retries=retries,
                progress=progress,
            )
        )
        return [results[index] for index in range(len(items))]
    if items_per_task > 1:
        chunks = task_chunks(todo, items_per_task)
        results.update(
            _run_chunks(
                job, site, items=items, ids=ids, chunks=chunks, retries=retries, progress=progress
            )
        )
        return [results[index] for index in range(len(items))]
    task = _task().options(
        max_retries=WORKER_DEATHS + retries, retry_exceptions=retries > 0, name=job_name(job)
    )
    refs = [task.remote(job, site, items[index], ids[index]) for index in todo]
    position = {ref: index for ref, index in zip(refs, todo, strict=True)}
    failures: dict[int, str] = {}
    desc = f"map_durable {job_name(job)}"
    bar = FanOutProgress(len(items), desc, enabled=progress, initial=len(results))
    try:
        for ref, ok, value in _settle(refs):
            index = position[ref]
            if ok:
                results[index] = value
            else:
                failures[index] = value
            bar.update(failed=not ok)
    finally:
        bar.close()
    if failures:
        raise FanOutError({ids[i]: failures[i] for i in sorted(failures)}, len(items))
    return [results[index] for index in range(len(items))]


def _run_chunks(
    job: Any,
    site: WorkerStore,
    *,
    items: list[Any],
    ids: list[str],
    chunks: list[list[int]],
    retries: int,
    progress: bool,
) -> dict[int, Any]:
    """One Ray task per chunk of item positions (:func:`run_tasks`); the results by position.

    Ray re-runs a chunk whose worker died (:data:`WORKER_DEATHS` times); runs that
    raised are retried inside the task, so Ray never retries an exception here.

    Raises:
        FanOutError: naming each run that did not complete (a lost task: all of its runs).
    """
    task = _chunk_task().options(
        max_retries=WORKER_DEATHS, retry_exceptions=False, name=job_name(job)
    )
    refs = [
        task.remote(job, site, [items[i] for i in chunk], [ids[i] for i in chunk], retries=retries)
        for chunk in chunks
    ]
    chunk_of = {ref: chunk for ref, chunk in zip(refs, chunks, strict=True)}
    outcomes = ChunkOutcomes(ids, chunks, f"map_durable {job_name(job)}", progress=progress)
    try:
        for ref, ok, value in _settle(refs):
            if ok:
                outcomes.settled(chunk_of[ref], value)
            else:
                outcomes.lost(chunk_of[ref], value)
    finally:
        outcomes.bar.close()
    return outcomes.completed()


def _run_planned(
    job: Any,
    site: WorkerStore,
    *,
    items: list[Any],
    ids: list[str],
    planner: ChunkPlanner,
    retries: int,
    progress: bool,
) -> dict[int, Any]:
    """The default chunking: tasks sized by ``planner`` as earlier ones finish; results by position.

    As in :func:`_run_chunks`, Ray re-runs a task whose worker died and runs that
    raised are retried inside the task.

    Raises:
        FanOutError: naming each run that did not complete (a lost task: all of its runs).
    """
    task = _timed_task().options(
        max_retries=WORKER_DEATHS, retry_exceptions=False, name=job_name(job)
    )
    desc = f"map_durable {job_name(job)}"
    outcomes = ChunkOutcomes(ids, [planner.todo], desc, progress=progress)
    chunk_of: dict[Any, list[int]] = {}

    def fill() -> None:
        while len(chunk_of) < planner.window and (chunk := planner.take()) is not None:
            ref = task.remote(
                job, site, [items[i] for i in chunk], [ids[i] for i in chunk], retries=retries
            )
            chunk_of[ref] = chunk

    try:
        fill()
        while chunk_of:
            done, _ = ray.wait(list(chunk_of), num_returns=1)
            for ref in done:
                chunk = chunk_of.pop(ref)
                try:
                    seconds, settled = ray.get(ref)
                except RayError as exc:
                    outcomes.lost(chunk, describe_failure(_cause(exc)))
                else:
                    planner.observe(len(chunk), seconds)
                    outcomes.settled(chunk, settled)
            fill()
    finally:
        outcomes.bar.close()
    log.debug("%s: %s", desc, planner.summary())
    return outcomes.completed()


def _settle(refs: list[Any]) -> Iterator[tuple[Any, bool, Any]]:
    """Each task as it finishes: ``(ref, True, its value)`` or ``(ref, False, why it failed)``."""
    pending = list(refs)
    while pending:
        # every task finished by now (at most _POLL_S to wait), not one wait per task
        done, pending = ray.wait(pending, num_returns=len(pending), timeout=_POLL_S)
        for ref in done:
            try:
                value = ray.get(ref)
            except RayError as exc:
                yield ref, False, describe_failure(_cause(exc))
            else:
                yield ref, True, value


def _task() -> Any:
    """:func:`run_task` as a Ray remote function, made once per process."""
    global _remote_task  # noqa: PLW0603 - one registration per process, made lazily
    if _remote_task is None:
        _remote_task = ray.remote(run_task)
    return _remote_task


def _chunk_task() -> Any:
    """:func:`run_tasks` as a Ray remote function, made once per process."""
    global _remote_chunk  # noqa: PLW0603 - one registration per process, made lazily
    if _remote_chunk is None:
        _remote_chunk = ray.remote(run_tasks)
    return _remote_chunk


def _timed_task() -> Any:
    """:func:`run_timed_tasks` as a Ray remote function, made once per process."""
    global _remote_timed  # noqa: PLW0603 - one registration per process, made lazily
    if _remote_timed is None:
        _remote_timed = ray.remote(run_timed_tasks)
    return _remote_timed


def _cause(exc: RayError) -> BaseException:
    """The run's own error inside Ray's wrapper (RayTaskError.cause), else the Ray error."""
    if isinstance(exc, RayTaskError):
        cause = getattr(exc, "cause", None)
        if isinstance(cause, BaseException):
            return cause
    return exc


__all__ = ["WORKER_DEATHS", "FanOutError", "SharedDirectory", "WorkerStore", "map_durable"]
