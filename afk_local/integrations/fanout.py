"""What every fan-out engine shares: run ids, the task a worker runs, outcomes, progress.

:func:`afk_local.integrations.dask.map_durable` and
:func:`afk_local.integrations.ray.map_durable` submit one task per item to
their engine; each task is :func:`run_task`, which opens the store on the
worker and calls ``job.run(item, run_id=...)``. That is the whole trick: a
task the engine re-runs after its worker died resumes the run from its last
checkpoint (finished ``ctx.step`` calls replayed, never repeated), and a task
whose run already completed returns the stored result without running. The
engine schedules and retries; afk_local has no scheduler of its own.

This module imports no engine (the engines' modules import it), so it works
and is tested without Dask or Ray installed. See docs/fanout.md.

Example:
    >>> from afk_local.integrations.fanout import default_run_id
    >>> default_run_id("resize image", 7)
    'fanout-resize-image-000007'
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import msgspec

from afk_local.errors import AfkLocalError, FanOutError, RunFailed
from afk_local.runner.run.durable_function import DurableFunction
from afk_local.storage.format.codec import DecHook, EncHook
from afk_local.storage.format.layout import validate_run_id
from afk_local.storage.format.records import error_info
from afk_local.storage.store import Store

log = logging.getLogger("afk_local")

RUN_PREFIX = "fanout-"
"""The prefix of :func:`default_run_id`'s ids: ``afk-local runs`` lists a fan-out together."""

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_NAME_MAX = 100  # leaves room for the prefix and the index within the 128 characters of a run id
_LOG_INTERVAL_S = 5.0
TARGET_TASK_S = 0.5
"""How long the default chunking aims to keep one task busy (amortising each task's overhead)."""
MAX_ITEMS_PER_TASK = 64
"""The most runs the default chunking puts in one task (each runs on its own thread)."""


@runtime_checkable
class WorkerStore(Protocol):
    """How a fan-out task reaches its run's store on a worker: the seam for other storage.

    ``map_durable`` pickles one of these into every task. On the worker,
    :meth:`open` builds the :class:`~afk_local.Store` the run is written to,
    :meth:`prepare` makes the run available there before ``job.run`` and
    :meth:`release` runs after it (also when it raised). :class:`SharedDirectory`
    needs neither hook: every worker sees the same directory. A store mirrored
    to an object store (``Store(root, mirror=URL)``, docs/fanout.md) would pull the
    run with ``--take`` semantics in ``prepare`` and push it in ``release``, so no
    shared filesystem is needed; that variant waits for the remote extra.
    """

    def open(self) -> Store:
        """The store this worker writes the run to."""
        ...

    def prepare(self, store: Store, run_id: str) -> None:
        """Make run ``run_id`` ready to be opened for writing on this worker."""
        ...

    def release(self, store: Store, run_id: str) -> None:
        """Called after the attempt on this worker ended (completed, failed or raised)."""
        ...


class SharedDirectory:
    """A store every worker reaches at the same path: one machine, or a network filesystem.

    Only the root and the store's options travel to the workers, never a key:
    a keyed store's workers read ``$AFK_LOCAL_KEY`` from their own environment,
    and a worker whose key setting differs from the client's refuses to run
    rather than write unsigned files or fail every signature check.

    Args:
        root: the store's directory; made absolute on the client, since
            workers may run in another working directory.
        keyed: whether the client's store signs its files (default: whether
            ``Store(root)`` would, i.e. ``$AFK_LOCAL_KEY`` is set here).
        enc_hook / dec_hook / max_record_bytes / lock_timeout / max_chain: as for
            :class:`~afk_local.Store`.

    Example:
        >>> SharedDirectory("/mnt/shared/afk")
        SharedDirectory('/mnt/shared/afk')
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        keyed: bool | None = None,
        enc_hook: EncHook | None = None,
        dec_hook: DecHook | None = None,
        **options: Any,
    ) -> None:
        unknown = set(options) - {"max_record_bytes", "lock_timeout", "max_chain"}
        if unknown:
            raise TypeError(
                f"SharedDirectory takes max_record_bytes, lock_timeout and max_chain, not "
                f"{', '.join(sorted(unknown))} (a key is never sent to workers: set "
                "$AFK_LOCAL_KEY in their environment)"
            )
        self.root = str(Path(root).absolute())
        self.keyed = Store(self.root).keyed if keyed is None else keyed
        self.enc_hook = enc_hook
        self.dec_hook = dec_hook
        self.options = dict(options)

    @classmethod
    def of(cls, store: Store) -> SharedDirectory:
        """The shared directory of ``store``: its root and options (never its key)."""
        if store.codec.enc_hook is not None:
            raise ValueError(
                f"{store!r} has custom encode/decode hooks, which map_durable cannot read back "
                "from it: pass store=SharedDirectory(root, enc_hook=..., dec_hook=...)"
            )
        return cls(
            store.root,
            keyed=store.keyed,
            max_record_bytes=store.max_record_bytes,
            lock_timeout=store.lock_timeout,
            max_chain=store.max_chain,
        )

    def __repr__(self) -> str:
        return f"SharedDirectory({self.root!r})"

    def open(self) -> Store:
        """``Store(root, **options)`` on this worker; refused if its key setting differs."""
        store = Store(self.root, enc_hook=self.enc_hook, dec_hook=self.dec_hook, **self.options)
        if store.keyed != self.keyed:
            has, lacks = ("has", "lacks") if self.keyed else ("lacks", "has")
            raise AfkLocalError(
                f"the store at {self.root} {has} a key on the client but this worker {lacks} "
                "one: map_durable never sends keys to workers; set (or unset) $AFK_LOCAL_KEY "
                "in the workers' environment to match"
            )
        return store

    def prepare(self, store: Store, run_id: str) -> None:
        """Nothing to do: every worker sees the run's directory."""

    def release(self, store: Store, run_id: str) -> None:
        """Nothing to do: the run's files are already where every worker sees them."""


def worker_store(store: Store | str | os.PathLike[str] | WorkerStore) -> WorkerStore:
    """What ``map_durable(store=...)`` sends to workers (a path or Store: a SharedDirectory).

    Example:
        >>> worker_store("/mnt/shared/afk")
        SharedDirectory('/mnt/shared/afk')
    """
    if isinstance(store, Store):
        return SharedDirectory.of(store)
    if isinstance(store, (str, os.PathLike)):
        return SharedDirectory(store)
    if isinstance(store, WorkerStore):
        return store
    raise TypeError(f"store must be a Store, a directory or a WorkerStore, not {store!r}")


def default_run_id(name: str, index: int) -> str:
    """``fanout-<name>-<index:06d>``: the run id of item ``index`` when no ``run_id`` is given.

    Example:
        >>> default_run_id("resize", 3)
        'fanout-resize-000003'

    The name is the job's function name with every character a run id cannot
    hold replaced by ``-``, so the same call finds the same runs again.
    """
    safe = _UNSAFE.sub("-", name).strip("-._")[:_NAME_MAX] or "job"
    return validate_run_id(f"{RUN_PREFIX}{safe}-{index:06d}")


def fanout_run_ids(
    job: DurableFunction[Any], items: Sequence[Any], run_id: Callable[[Any], str] | None
) -> list[str]:
    """The run id of every item: ``run_id(item)``, else :func:`default_run_id`; valid and unique.

    Example:
        >>> fanout_run_ids(resize, ["a.jpg", "b.jpg"], None)  # doctest: +SKIP
        ['fanout-resize-000000', 'fanout-resize-000001']

    Raises:
        InvalidRunIdError: ``run_id(item)`` gave an id the run-id rules refuse.
        ValueError: two items got the same id.
    """
    if run_id is None:
        ids = [default_run_id(job_name(job), i) for i in range(len(items))]
    else:
        ids = [validate_run_id(run_id(item)) for item in items]
    seen: dict[str, int] = {}
    for index, rid in enumerate(ids):
        if rid in seen:
            raise ValueError(
                f"items {seen[rid]} and {index} both map to run id {rid!r}: each item is one "
                "run, so run_id(item) must give every item its own id"
            )
        seen[rid] = index
    return ids


def job_name(job: DurableFunction[Any]) -> str:
    """The job's function name, from its ``module:qualname`` entrypoint.

    Example:
        >>> job_name(resize)  # doctest: +SKIP
        'resize'
    """
    return job.entrypoint.rpartition(":")[2].rpartition(".")[2]


def portable_job(fn: Any) -> DurableFunction[Any]:
    """``fn`` without its own store, ready to be pickled into tasks (TypeError unless durable).

    Example:
        >>> portable_job(resize).store is None  # doctest: +SKIP
        True
    """
    if not isinstance(fn, DurableFunction):
        raise TypeError(
            f"map_durable runs @afk.durable jobs, not {fn!r}: decorate the function with "
            "@afk.durable (its first parameter is the RunContext, the second the item)"
        )
    return fn.with_store(None)


def run_task(job: DurableFunction[Any], site: WorkerStore, item: Any, run_id: str) -> Any:
    """One fan-out task, run by the engine on a worker: start, resume or settle run ``run_id``.

    Example:
        >>> run_task(portable_job(resize), worker_store(root), "a.jpg", "r-a")  # doctest: +SKIP
        'a-thumb.jpg'

    Returns the job's result as the store keeps it (msgpack: lists for tuples),
    the same value whether the run ran now or had completed before, so every
    ``map_durable`` call over the same items returns equal lists.
    Raises :class:`RunFailed` when the run failed, was paused or cancelled, or
    could not be opened: the engine sees a task that raised, and retries it if
    it was told to.
    """
    try:
        store = site.open()
        site.prepare(store, run_id)
        try:
            result = job.with_store(store).run(item, run_id=run_id)
        finally:
            site.release(store, run_id)
        return msgspec.msgpack.decode(store.codec.encode(result))
    except Exception as exc:
        info = error_info(exc)
        raise RunFailed(run_id, info.type, info.message, info.traceback or "") from None


def run_tasks(
    job: DurableFunction[Any],
    site: WorkerStore,
    items: Sequence[Any],
    run_ids: Sequence[str],
    *,
    retries: int = 0,
) -> list[tuple[bool, Any]]:
    """Several fan-out runs in one engine task, each on its own thread, all at once.

    Example:
        >>> run_tasks(resize, worker_store(root), ["a.jpg"], ["r-a"])  # doctest: +SKIP
        [(True, 'a-thumb.jpg')]

    Each item is :func:`run_task` on its own thread: its run keeps every guarantee
    (each fsync made before the call that needs it returns), and the fsyncs of the
    runs overlap, which a filesystem commits together (what ``items_per_task`` buys).
    A run that raised is run again up to ``retries`` times here (each retry resumes it,
    as an engine's retry would). Returns ``(True, result)`` or ``(False, RunFailed)``
    per item, in order: one run's failure never hides another's result.
    """
    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415 - only chunked fan-outs

    def one(index: int) -> tuple[bool, Any]:
        for attempt in range(retries + 1):
            try:
                return True, run_task(job, site, items[index], run_ids[index])
            except RunFailed as exc:
                if attempt == retries:
                    return False, exc
        raise AssertionError("unreachable")  # pragma: no cover

    if len(items) != len(run_ids):
        raise ValueError("run_tasks needs one run id per item")
    with ThreadPoolExecutor(max(1, len(items)), thread_name_prefix="afk-fanout") as pool:
        return list(pool.map(one, range(len(items))))


def run_timed_tasks(
    job: DurableFunction[Any],
    site: WorkerStore,
    items: Sequence[Any],
    run_ids: Sequence[str],
    *,
    retries: int = 0,
) -> tuple[float, list[tuple[bool, Any]]]:
    """:func:`run_tasks`, and the seconds it took on the worker (what :class:`ChunkPlanner` learns).

    Example:
        >>> run_timed_tasks(resize, worker_store(root), ["a.jpg"], ["r-a"])  # doctest: +SKIP
        (0.012, [(True, 'a-thumb.jpg')])
    """
    start = time.perf_counter()
    if len(items) == 1 and len(run_ids) == 1:  # no thread pool for a task of one run

        def one() -> tuple[bool, Any]:
            for attempt in range(retries + 1):
                try:
                    return True, run_task(job, site, items[0], run_ids[0])
                except RunFailed as exc:
                    if attempt == retries:
                        return False, exc
            raise AssertionError("unreachable")  # pragma: no cover

        outcomes = [one()]
    else:
        outcomes = run_tasks(job, site, items, run_ids, retries=retries)
    return time.perf_counter() - start, outcomes


class ChunkPlanner:
    """The default chunking of a fan-out: which item positions the next task runs.

    The first tasks run one item each. As tasks finish, :meth:`observe` learns the
    cost of one item (a task's seconds on its worker over its items, smoothed); the
    next task gets about ``target_s`` worth of items, at most four times the previous
    task's and ``max_items``, and never more than a worker slot's share of the items
    left (so no task outlasts ``target_s`` by much and the last ones still spread over
    the workers). Expensive items (one costs ``target_s`` or more) and short lists
    (two tasks per slot or fewer) stay at one item per task. The engine keeps :attr:`window`
    tasks in flight and asks :meth:`take` for the next as each one finishes.

    Args:
        todo: the positions of the items still to run, in order.
        slots: how many tasks the cluster runs at once (its workers' threads).
        target_s / max_items: see :data:`TARGET_TASK_S` and :data:`MAX_ITEMS_PER_TASK`.

    Example:
        >>> planner = ChunkPlanner(range(100), slots=2)
        >>> planner.take(), planner.take()
        ([0], [1])
        >>> planner.observe(1, 0.005)  # cheap items: the next tasks grow
        >>> planner.take()
        [2, 3, 4, 5]
    """

    def __init__(
        self,
        todo: Sequence[int],
        slots: int,
        *,
        target_s: float = TARGET_TASK_S,
        max_items: int = MAX_ITEMS_PER_TASK,
    ) -> None:
        self.todo = list(todo)
        """The positions of the items to run, in order."""
        self._next = 0
        self.slots = max(1, slots)
        self.window = 2 * self.slots
        """How many tasks the engine keeps submitted and unfinished."""
        self.target_s = target_s
        self.max_items = max(1, max_items)
        self.cost_s: float | None = None
        """The smoothed seconds one item costs, once a task finished."""
        self.sizes: list[int] = []
        """How many items each task taken so far got, in order."""

    def observe(self, items: int, seconds: float) -> None:
        """A task of ``items`` runs took ``seconds`` on its worker."""
        per_item = max(seconds, 0.0) / max(1, items)
        self.cost_s = per_item if self.cost_s is None else (self.cost_s + per_item) / 2

    def take(self) -> list[int] | None:
        """The positions of the next task's items, or None when every item was taken."""
        left = len(self.todo) - self._next
        if left <= 0:
            return None
        size = 1
        if self.cost_s is not None:
            wanted = int(self.target_s / self.cost_s) if self.cost_s > 0 else self.max_items
            grown = 4 * self.sizes[-1] if self.sizes else 1
            balanced = -(-left // self.slots)  # every slot still gets a share of the rest
            size = max(1, min(wanted, grown, balanced, self.max_items))
        chunk = self.todo[self._next : self._next + size]
        self._next += len(chunk)
        self.sizes.append(len(chunk))
        return chunk

    def summary(self) -> str:
        """``N runs in T tasks of A-B items``: for the debug log."""
        if not self.sizes:
            return "no tasks"
        return (
            f"{sum(self.sizes)} runs in {len(self.sizes)} tasks of "
            f"{min(self.sizes)}-{max(self.sizes)} items"
        )


def check_items_per_task(items_per_task: int) -> None:
    """Refuse an ``items_per_task`` below 1 (ValueError), before a fan-out reads or starts anything.

    Example:
        >>> check_items_per_task(8)
    """
    if items_per_task < 1:
        raise ValueError(f"items_per_task must be at least 1, not {items_per_task}")


def task_chunks(todo: Sequence[int], items_per_task: int) -> list[list[int]]:
    """The item positions of each task when a task runs ``items_per_task`` runs at once.

    Example:
        >>> task_chunks([0, 2, 3, 4, 7], 2)
        [[0, 2], [3, 4], [7]]

    Raises:
        ValueError: ``items_per_task`` is below 1.
    """
    check_items_per_task(items_per_task)
    return [list(todo[i : i + items_per_task]) for i in range(0, len(todo), items_per_task)]


def describe_failure(exc: BaseException) -> str:
    """One line for :attr:`FanOutError.failures`: ``Type: message`` of the run's own error.

    Example:
        >>> describe_failure(RunFailed("r-1", "ValueError", "bad item"))
        'ValueError: bad item'
    """
    if isinstance(exc, RunFailed):
        return f"{exc.error_type}: {exc.message}"
    return f"{type(exc).__name__}: {exc}"


class FanOutProgress:
    """One progress bar for a whole fan-out: tqdm when installed, else a log line every 5 s.

    Args:
        total: how many runs.
        desc: the label (``map_durable resize``).
        enabled: False turns it off.
        initial: runs already complete before anything was submitted.
    """

    def __init__(self, total: int, desc: str, *, enabled: bool = True, initial: int = 0) -> None:
        self.total = total
        self.desc = desc
        self.done = initial
        self.failed = 0
        self._bar: Any = None
        self._enabled = enabled
        self._last_log = time.monotonic()
        if not enabled:
            return
        try:
            from tqdm.auto import tqdm  # type: ignore[import-untyped,unused-ignore]  # noqa: PLC0415
        except ImportError:
            log.info("%s: %d runs submitted", desc, total - initial)
            return
        self._bar = tqdm(total=total, initial=initial, desc=desc, unit="run", dynamic_ncols=True)

    def update(self, *, failed: bool = False) -> None:
        """Count one more run finished (``failed``: it did not complete)."""
        self.done += 1
        self.failed += failed
        if not self._enabled:
            return
        if self._bar is not None:
            self._bar.update(1)
            if failed:
                self._bar.set_postfix(failed=self.failed, refresh=False)
            return
        now = time.monotonic()
        if now - self._last_log >= _LOG_INTERVAL_S:
            self._last_log = now
            self._log()

    def close(self) -> None:
        """Finish the bar (or log the final count)."""
        if not self._enabled:
            return
        self._enabled = False
        if self._bar is not None:
            self._bar.close()
        else:
            self._log()

    def _log(self) -> None:
        failed = f", {self.failed} failed" if self.failed else ""
        log.info("%s: %d/%d runs finished%s", self.desc, self.done, self.total, failed)


class ChunkOutcomes:
    """What the client learns from a fan-out's chunk tasks (:func:`run_tasks`), run by run.

    Args:
        ids: every item's run id, by position.
        chunks: the positions each task runs (:func:`task_chunks`).
        desc: the progress bar's label.
        progress: whether to show it (:class:`FanOutProgress`).

    Example:
        >>> outcomes = ChunkOutcomes(["r-a", "r-b"], [[0, 1]], "map_durable f", progress=False)
        >>> outcomes.settled([0, 1], [(True, 1), (False, RunFailed("r-b", "ValueError", "no"))])
        >>> outcomes.failures
        {'r-b': 'ValueError: no'}
    """

    def __init__(
        self, ids: Sequence[str], chunks: Sequence[Sequence[int]], desc: str, *, progress: bool
    ) -> None:
        self.ids = ids
        self.results: dict[int, Any] = {}
        self._failed: dict[int, str] = {}
        self.bar = FanOutProgress(
            len(ids), desc, enabled=progress, initial=len(ids) - sum(map(len, chunks))
        )

    def settled(self, chunk: Sequence[int], outcomes: Sequence[tuple[bool, Any]]) -> None:
        """A chunk's task returned: each run's result, or its own failure."""
        for index, (ok, value) in zip(chunk, outcomes, strict=True):
            if ok:
                self.results[index] = value
            else:
                self._failed[index] = describe_failure(value)
            self.bar.update(failed=not ok)

    def lost(self, chunk: Sequence[int], why: str) -> None:
        """A chunk's task itself failed (its worker died too often, or it was cancelled)."""
        for index in chunk:
            self._failed[index] = why
            self.bar.update(failed=True)

    @property
    def failures(self) -> dict[str, str]:
        """Run id -> why, for each run that did not complete, in item order."""
        return {self.ids[index]: self._failed[index] for index in sorted(self._failed)}

    def completed(self) -> dict[int, Any]:
        """The completed runs' results by position, once every chunk is settled or lost.

        Raises:
            FanOutError: naming each run that did not complete.
        """
        if self.failures:
            raise FanOutError(self.failures, len(self.ids))
        return self.results


__all__ = [
    "MAX_ITEMS_PER_TASK",
    "RUN_PREFIX",
    "TARGET_TASK_S",
    "ChunkOutcomes",
    "ChunkPlanner",
    "FanOutError",
    "FanOutProgress",
    "RunFailed",
    "SharedDirectory",
    "WorkerStore",
    "check_items_per_task",
    "default_run_id",
    "describe_failure",
    "fanout_run_ids",
    "job_name",
    "portable_job",
    "run_task",
    "run_tasks",
    "run_timed_tasks",
    "task_chunks",
    "worker_store",
]
