"""Many durable runs on a Dask cluster (extra ``[dask]``): :func:`map_durable`.

Each item is one durable run; by default the first tasks run one item each and
later ones more while the items prove cheap (``items_per_task=N``: N runs share
each task). Dask schedules the tasks and re-runs those whose worker died; a
re-run task resumes its runs from their last checkpoints, so finished
``ctx.step`` calls are replayed, never repeated. Storage is a directory every
worker sees (docs/fanout.md says what that asks of a network filesystem).

Example:
    >>> from distributed import Client  # doctest: +SKIP
    >>> from afk_local.integrations.dask import map_durable  # doctest: +SKIP
    >>> with Client(n_workers=2) as client:  # doctest: +SKIP
    ...     sizes = map_durable(resize, paths, store="/shared/afk", client=client)
"""

from __future__ import annotations

import functools
import logging
import os
import uuid
from collections.abc import Callable, Iterable
from typing import Any

try:
    import distributed
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "afk_local.integrations.dask needs Dask's distributed scheduler: "
        "pip install 'afk_local[dask]'"
    ) from exc

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

log = logging.getLogger("afk_local")


def map_durable(
    fn: Any,
    items: Iterable[Any],
    *,
    store: Store | str | os.PathLike[str] | WorkerStore,
    run_id: Callable[[Any], str] | None = None,
    client: distributed.Client | None = None,
    retries: int = 0,
    progress: bool = True,
    items_per_task: int | None = None,
) -> list[Any]:
    """Run ``fn(ctx, item)`` as one durable run per item on Dask; the results in item order.

    Example:
        >>> @afk.durable  # doctest: +SKIP
        ... def square(ctx, x):
        ...     return ctx.step("square", pow, x, 2)
        >>> map_durable(square, [1, 2, 3], store="/shared/afk", client=client)  # doctest: +SKIP
        [1, 4, 9]

    A task whose worker died is re-run by Dask (up to the scheduler's
    ``distributed.scheduler.allowed-failures`` times, 3 by default) and resumes
    its run from the last checkpoint; a run that already completed returns its
    stored result without running: the client reads it from the store and
    submits no task for it (a call over a finished fan-out needs no client).
    Call it again after any failure: it finds the same runs by their ids.

    Args:
        fn: an ``@afk.durable`` job taking the item as its one argument
            (msgpack-able, since it is stored in ``run.meta``).
        items: the items, one run each.
        store: where the runs live: a :class:`~afk_local.Store` or directory that
            every worker reaches at the same path, or a
            :class:`~afk_local.integrations.fanout.WorkerStore`.
        run_id: ``run_id(item) -> str``; default ``fanout-<function name>-<index>``.
        client: the Dask client; default the current one (``distributed.get_client()``).
        retries: how often Dask re-runs a task whose run raised; each retry resumes
            the failed run (attempt + 1, finished steps replayed). Default 0.
        progress: one progress bar for all runs (tqdm when installed, else log lines).
        items_per_task: items per Dask task. Default (None): chosen as the fan-out
            goes (:class:`~afk_local.integrations.fanout.ChunkPlanner`): one item per
            task at first and for expensive items or short lists, more per task while
            items prove cheap, keeping two tasks per worker thread for balance. ``1``:
            always one task per item, like ``client.map``. With more than one, a task
            runs its items' runs at once, each on its own thread of the worker, so that
            their fsyncs overlap and the filesystem commits them together: for many
            small items the runs cost far less (see docs/fanout.md). Every run keeps
            every guarantee; what changes is that several items may run at the same
            time in one worker process (mind their memory and ``fn``'s thread safety),
            that a worker's death re-runs the whole task (its completed runs return
            their stored results), and that ``retries`` are made inside the task
            (also by default).

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
    if not todo:  # nothing left to run (or no items): no task, no client needed
        return [results[index] for index in range(len(items))]
    if client is None:
        try:
            client = distributed.get_client()
        except ValueError:
            raise ValueError(
                "map_durable needs a Dask client: pass client=distributed.Client(...) or "
                "create one first (it becomes the default)"
            ) from None
    if items_per_task is None:
        planner = ChunkPlanner(todo, _slots(client))
        results.update(
            _run_planned(
                client,
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
                client,
                job,
                site,
                items=items,
                ids=ids,
                chunks=chunks,
                retries=retries,
                progress=progress,
            )
        )
        return [results[index] for index in range(len(items))]
    futures = [
        client.submit(
            run_task,
            job,
            site,
            items[index],
            ids[index],
            key=f"{ids[index]}-{uuid.uuid4().hex}",
            pure=False,
            retries=retries,
        )
        for index in todo
    ]
    desc = f"map_durable {job_name(job)}"
    bar = FanOutProgress(len(items), desc, enabled=progress, initial=len(results))
    try:
        for future in distributed.as_completed(futures):  # type: ignore[no-untyped-call]
            bar.update(failed=future.status != "finished")
    finally:
        bar.close()
    failures = {
        ids[index]: _why(future)
        for index, future in zip(todo, futures, strict=True)
        if future.status != "finished"
    }
    if failures:
        raise FanOutError(failures, len(items))
    gathered = client.gather(futures)  # type: ignore[no-untyped-call]
    results.update(zip(todo, gathered, strict=True))
    return [results[index] for index in range(len(items))]


def _run_chunks(
    client: distributed.Client,
    job: Any,
    site: WorkerStore,
    *,
    items: list[Any],
    ids: list[str],
    chunks: list[list[int]],
    retries: int,
    progress: bool,
) -> dict[int, Any]:
    """One task per chunk of item positions (:func:`run_tasks`); the results by position.

    Raises:
        FanOutError: naming each run that did not complete (a lost task: all of its runs).
    """
    futures = [
        client.submit(
            functools.partial(run_tasks, retries=retries),  # submit's own retries= is Dask's
            job,
            site,
            [items[index] for index in chunk],
            [ids[index] for index in chunk],
            key=f"{ids[chunk[0]]}-{len(chunk)}-{uuid.uuid4().hex}",
            pure=False,
        )
        for chunk in chunks
    ]
    chunk_of = {future.key: chunk for future, chunk in zip(futures, chunks, strict=True)}
    outcomes = ChunkOutcomes(ids, chunks, f"map_durable {job_name(job)}", progress=progress)
    try:
        for future in distributed.as_completed(futures):  # type: ignore[no-untyped-call]
            chunk = chunk_of[future.key]
            if future.status != "finished":
                outcomes.lost(chunk, _why(future))
            else:
                outcomes.settled(chunk, future.result())
    finally:
        outcomes.bar.close()
    return outcomes.completed()


def _run_planned(
    client: distributed.Client,
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

    Raises:
        FanOutError: naming each run that did not complete (a lost task: all of its runs).
    """
    desc = f"map_durable {job_name(job)}"
    outcomes = ChunkOutcomes(ids, [planner.todo], desc, progress=progress)
    chunk_of: dict[Any, list[int]] = {}
    pending = distributed.as_completed()  # type: ignore[no-untyped-call]

    def fill() -> None:
        while len(chunk_of) < planner.window and (chunk := planner.take()) is not None:
            future = client.submit(
                functools.partial(run_timed_tasks, retries=retries),
                job,
                site,
                [items[index] for index in chunk],
                [ids[index] for index in chunk],
                key=f"{ids[chunk[0]]}-{len(chunk)}-{uuid.uuid4().hex}",
                pure=False,
            )
            chunk_of[future.key] = chunk
            pending.add(future)  # type: ignore[no-untyped-call]

    try:
        fill()
        for future in pending:
            chunk = chunk_of.pop(future.key)
            if future.status != "finished":
                outcomes.lost(chunk, _why(future))
            else:
                seconds, settled = future.result()
                planner.observe(len(chunk), seconds)
                outcomes.settled(chunk, settled)
            fill()
    finally:
        outcomes.bar.close()
    log.debug("%s: %s", desc, planner.summary())
    return outcomes.completed()


def _slots(client: distributed.Client) -> int:
    """How many tasks the cluster runs at once: its workers' threads (at least 1), asked
    of the scheduler now (``scheduler_info()`` is a copy refreshed every few seconds: a
    worker that just came back, after one died, is missing from it)."""
    threads = client.nthreads()  # type: ignore[no-untyped-call]
    return max(1, sum(int(n) for n in threads.values()))


def _why(future: distributed.Future[Any]) -> str:
    if future.status == "cancelled":
        return "CancelledError: the Dask task was cancelled"
    return describe_failure(future.exception())  # type: ignore[no-untyped-call]


__all__ = ["FanOutError", "SharedDirectory", "WorkerStore", "map_durable"]
