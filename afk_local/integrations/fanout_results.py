"""A fan-out's completed runs, read back on the client: no task, no engine for finished work.

``map_durable`` asks :func:`completed_results` which items' runs already
completed *with this very item* (same job, same stored argument) and takes their
stored results from the store directly; only the other items become tasks. A
call over a finished fan-out therefore submits nothing and needs no cluster
(a Dask client, a Ray instance) at all, and a half-finished one schedules only
what is left. A run whose id matches but whose job or argument differs is left
to its task, which reports the mismatch as ``job.run`` does.

Only a store the client can open itself is read: a :class:`~afk_local.Store`,
a directory, or a :class:`~afk_local.integrations.fanout.SharedDirectory`. Any
other :class:`~afk_local.integrations.fanout.WorkerStore` (a store mirrored to
an object store, say) is read by its tasks.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

import msgspec

from afk_local.errors import AfkLocalError
from afk_local.integrations.fanout import SharedDirectory, WorkerStore
from afk_local.runner.run.durable_function import DurableFunction
from afk_local.storage.format.records import RunStatus
from afk_local.storage.store import Store

log = logging.getLogger("afk_local")


def client_store(store: Store | str | os.PathLike[str] | WorkerStore) -> Store | None:
    """The store as the client can read it, or None when only the workers can.

    Example:
        >>> client_store("/shared/afk")  # doctest: +SKIP
        Store(root='/shared/afk')
    """
    if isinstance(store, Store):
        return store  # the caller's own, with its key and hooks
    if isinstance(store, (str, os.PathLike)):
        return Store(store)
    if isinstance(store, SharedDirectory):
        try:
            return store.open()
        except AfkLocalError:  # this process's key setting differs: the tasks say so
            return None
    return None


def completed_results(
    store: Store | None, job: DurableFunction[Any], items: Sequence[Any], ids: Sequence[str]
) -> dict[int, Any]:
    """The stored result of every item whose run completed with that item, by position.

    Example:
        >>> completed_results(Store("/shared/afk"), resize, ["a.jpg"], ["r-a"])  # doctest: +SKIP
        {0: 'a-thumb.jpg'}

    A run that is missing, unfinished, of another job, started with another
    argument, or unreadable here is simply not in the answer: its task runs
    (and resumes it, or reports what is wrong).
    """
    found: dict[int, Any] = {}
    if store is None:
        return found
    for index, (item, run_id) in enumerate(zip(items, ids, strict=True)):
        try:
            if not store.exists(run_id):
                continue
            meta = store.read_meta(run_id)
            if meta.status is not RunStatus.COMPLETED or meta.entrypoint != job.entrypoint:
                continue
            if meta.params != _as_stored(store, {"args": [item], "kwargs": {}}):
                continue
            found[index] = store.open(run_id).resume_state().result
        except (AfkLocalError, OSError, TypeError, msgspec.EncodeError) as exc:
            log.info("fan-out run %s: not read back here, its task will (%s)", run_id, exc)
    return found


def _as_stored(store: Store, value: Any) -> Any:
    """``value`` as the store's codec writes it and msgpack gives it back (job.run's params)."""
    return msgspec.msgpack.decode(store.codec.encode(value))


__all__ = ["client_store", "completed_results"]
