"""A LangGraph checkpointer on afk_local run directories (extra ``[langgraph]``).

:class:`AfkLocalSaver` stores every LangGraph thread in one afk_local run
directory (``<root>/runs/lg-<thread slug>-<hash>/``):

- each LangGraph checkpoint is one immutable checkpoint file of phase
  ``langgraph`` written through :meth:`afk_local.RunWriter.checkpoint`, so it
  is zstd-compressed, delta-encoded against the previous one, crc-checked and
  published with fsync + rename before ``put`` returns;
- pending writes (what finished tasks of a superstep produced) are appended to
  ``langgraph.writes`` in the same run directory, one crc-framed record per
  ``put_writes`` call, fsynced before the call returns, so tasks that finished
  before a kill -9 are not run again;
- values go through LangGraph's serializer (``serde``); the default is
  ``JsonPlusSerializer(pickle_fallback=False)`` and a stored ``pickle`` value is
  refused.

This module adapts LangGraph's checkpointer API; the files live in
:mod:`~afk_local.integrations.langgraph.threads` (run directories and open
writers), :mod:`~afk_local.integrations.langgraph.index` (checkpoint payloads
and the index cache) and :mod:`~afk_local.integrations.langgraph.writes`
(pending writes), none of which imports LangGraph.

Example:
    >>> from langgraph.graph import StateGraph  # doctest: +SKIP
    >>> with AfkLocalSaver.from_path(".afk") as saver:  # doctest: +SKIP
    ...     graph = builder.compile(checkpointer=saver)
    ...     graph.invoke(inputs, {"configurable": {"thread_id": "t1"}}, durability="sync")

See docs/langgraph.md for the layout, the guarantees and the limits.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import importlib
import os
import random
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import TYPE_CHECKING, Any

try:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        WRITES_IDX_MAP,
        BaseCheckpointSaver,
        ChannelVersions,
        Checkpoint,
        CheckpointMetadata,
        CheckpointTuple,
        get_checkpoint_id,
        get_checkpoint_metadata,
        writes_sort_key,
    )
    from langgraph.checkpoint.serde.base import SerializerProtocol
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "afk_local.integrations.langgraph needs LangGraph: pip install 'afk_local[langgraph]'"
    ) from exc

# The storage side loads on first use, not on import: importing the saver costs about
# what importing LangGraph's own SqliteSaver does (docs/benchmarks.md, "Imports").
if TYPE_CHECKING:
    from afk_local.integrations.langgraph.index import (
        INDEX_NAME,
        PHASE,
        IndexEntry,
        Payload,
        ThreadIndex,
    )
    from afk_local.integrations.langgraph.threads import INTEGRATION, RUN_PREFIX, thread_run_id
    from afk_local.integrations.langgraph.writes import WRITES_NAME, Typed, WriteFrame
    from afk_local.storage.store import Store

_INDEX = "afk_local.integrations.langgraph.index"
_THREADS = "afk_local.integrations.langgraph.threads"
_WRITES = "afk_local.integrations.langgraph.writes"
_REEXPORTED = {
    "INDEX_NAME": _INDEX,
    "PHASE": _INDEX,
    "INTEGRATION": _THREADS,
    "RUN_PREFIX": _THREADS,
    "thread_run_id": _THREADS,
    "WRITES_NAME": _WRITES,
}


def __getattr__(name: str) -> Any:
    """The names this module re-exports from the modules that own them, on first use."""
    module = _REEXPORTED.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


class AfkLocalSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer that keeps every thread in an afk_local run directory.

    Args:
        store: an :class:`afk_local.Store`, or the root directory of one.
        serde: LangGraph serializer for values; default
            ``JsonPlusSerializer(pickle_fallback=False)``.
        lock_timeout: seconds to wait for a thread's ``owner.lock`` held by
            another process before :class:`afk_local.RunLockedError`.
        max_open_threads: threads kept open (lock and descriptors held) at once;
            the least recently used are closed beyond this.

    A thread is written by one saver at a time: the saver holds the thread's
    ``owner.lock`` from its first write until :meth:`close` (or the end of a
    ``with`` block). Use ``durability="sync"`` in ``graph.invoke`` for the
    strongest guarantee: each step's checkpoint is on disk before the next
    step starts.
    """

    def __init__(
        self,
        store: Store | str | os.PathLike[str] | None = None,
        *,
        serde: SerializerProtocol | None = None,
        lock_timeout: float = 0.0,
        max_open_threads: int = 32,
    ) -> None:
        from afk_local.integrations.langgraph.threads import ThreadFiles  # noqa: PLC0415
        from afk_local.storage.store import Store  # noqa: PLC0415

        super().__init__(serde=serde or JsonPlusSerializer(pickle_fallback=False))
        self.store = store if isinstance(store, Store) else Store(store)
        self._lock = threading.RLock()
        self._threads = ThreadFiles(
            self.store, lock_timeout=lock_timeout, max_open_threads=max_open_threads
        )

    @classmethod
    def from_path(cls, path: str | os.PathLike[str], **options: Any) -> AfkLocalSaver:
        """A saver on the store at ``path``; use it as a context manager to close it.

        Example:
            >>> with AfkLocalSaver.from_path(".afk") as saver:  # doctest: +SKIP
            ...     graph = builder.compile(checkpointer=saver)
        """
        return cls(path, **options)

    def __repr__(self) -> str:
        return f"AfkLocalSaver(root={str(self.store.root)!r})"

    @property
    def lock_timeout(self) -> float:
        """Seconds to wait for a thread's ``owner.lock`` held by another process."""
        return self._threads.lock_timeout

    @lock_timeout.setter
    def lock_timeout(self, value: float) -> None:
        self._threads.lock_timeout = value

    @property
    def max_open_threads(self) -> int:
        """Threads kept open (lock and descriptors held) at once."""
        return self._threads.max_open_threads

    @max_open_threads.setter
    def max_open_threads(self, value: int) -> None:
        self._threads.max_open_threads = max(1, value)

    # -- lifetime -----------------------------------------------------------------

    def close(self) -> None:
        """Close every open thread: mark it idle (``paused``) and release its lock."""
        with self._lock:
            self._threads.close()

    def __enter__(self) -> AfkLocalSaver:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> AfkLocalSaver:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await asyncio.to_thread(self.close)

    # -- sync API -----------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint named by ``config`` (or the thread's newest), with its pending writes."""
        conf = config["configurable"]
        thread_id = str(conf["thread_id"])
        ns = str(conf.get("checkpoint_ns", ""))
        checkpoint_id = get_checkpoint_id(config)
        from afk_local.errors import CheckpointCorruptionError  # noqa: PLC0415

        with self._lock:
            if not checkpoint_id:
                cold = self._threads.newest_cold(thread_id, ns)
                if cold is not None:
                    with contextlib.suppress(CheckpointCorruptionError):
                        return self._tuple(thread_id, cold[0], cold[1], payload=cold[2])
                    # the cache and the file disagree: build the index, as without it
            index = self._threads.index(thread_id)
            if index is None:
                return None
            if checkpoint_id:
                entry = index.by_key.get((ns, checkpoint_id))
            else:
                candidates = [e for e in index.by_key.values() if e.ns == ns]
                entry = max(candidates, key=lambda e: e.checkpoint_id) if candidates else None
            if entry is None:
                return None
            return self._tuple(thread_id, index, entry)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints matching ``config``, newest (highest checkpoint id) first.

        ``config=None`` lists every thread; without ``checkpoint_ns`` in the
        config every namespace of the thread is listed. ``filter`` compares
        top-level metadata keys for equality; ``before`` keeps ids below its
        checkpoint id; ``limit`` counts matches.
        """
        return iter(self._list(config, filter=filter, before=before, limit=limit))

    def _list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> builtins.list[CheckpointTuple]:
        conf = config["configurable"] if config else {}
        ns = conf.get("checkpoint_ns")  # absent: every namespace
        wanted_id = get_checkpoint_id(config) if config else None
        before_id = get_checkpoint_id(before) if before else None
        found: builtins.list[CheckpointTuple] = []
        with self._lock:
            threads = [str(conf["thread_id"])] if config else self._threads.thread_ids()
            candidates: builtins.list[tuple[str, ThreadIndex, IndexEntry]] = []
            for thread_id in threads:
                index = self._threads.index(thread_id)
                if index is None:
                    continue
                for entry in index.by_key.values():
                    if ns is not None and entry.ns != ns:
                        continue
                    if wanted_id and entry.checkpoint_id != wanted_id:
                        continue
                    if before_id and entry.checkpoint_id >= before_id:
                        continue
                    candidates.append((thread_id, index, entry))
            candidates.sort(key=lambda c: (c[2].checkpoint_id, c[0], c[2].ns), reverse=True)
            for thread_id, index, entry in candidates:
                if limit is not None and len(found) >= limit:
                    break
                if filter:
                    metadata = self._loads(entry.metadata)
                    if not all(metadata.get(k) == v for k, v in filter.items()):
                        continue
                found.append(self._tuple(thread_id, index, entry, one=False))
        return found

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Durably store ``checkpoint`` (values inline) as the child of ``config``'s checkpoint.

        Returns only after the checkpoint file is fsynced and renamed into place.
        """
        conf = config["configurable"]
        thread_id = str(conf["thread_id"])
        ns = str(conf.get("checkpoint_ns", ""))
        from afk_local.integrations.langgraph.index import (  # noqa: PLC0415
            PAYLOAD_FORMAT,
            Payload,
        )

        full_metadata = get_checkpoint_metadata(config, metadata)
        run_id = full_metadata.get("run_id")
        payload = Payload(
            format=PAYLOAD_FORMAT,
            thread_id=thread_id,
            ns=ns,
            id=checkpoint["id"],
            parent=conf.get("checkpoint_id"),
            checkpoint=self.serde.dumps_typed(checkpoint),
            metadata=self.serde.dumps_typed(full_metadata),
            run_id=run_id if isinstance(run_id, str) else None,
        )
        step = full_metadata.get("step", 0)
        with self._lock:
            handle = self._threads.handle(thread_id)
            self._threads.write_checkpoint(handle, payload, step if isinstance(step, int) else 0)
        return {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint["id"],
            }
        }

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Durably append the writes of task ``task_id`` to the checkpoint named by ``config``.

        Idempotent per ``(task_id, index)``: a regular write stored once is kept,
        special channels (errors, interrupts, ...) keep the newest value.
        """
        from afk_local.storage.format.frames import encode_msgpack_frame  # noqa: PLC0415

        conf = config["configurable"]
        thread_id = str(conf["thread_id"])
        items = [
            (WRITES_IDX_MAP.get(channel, i), channel, *self.serde.dumps_typed(value))
            for i, (channel, value) in enumerate(writes)
        ]
        frame: WriteFrame = (
            str(conf.get("checkpoint_ns", "")),
            str(conf["checkpoint_id"]),
            task_id,
            task_path,
            items,
        )
        with self._lock:
            handle = self._threads.handle(thread_id)
            self._threads.append_writes(handle, encode_msgpack_frame(frame))

    def delete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint and write of ``thread_id`` (its whole run directory)."""
        from afk_local.errors import RunNotFoundError  # noqa: PLC0415
        from afk_local.integrations.langgraph.threads import thread_run_id  # noqa: PLC0415

        thread = str(thread_id)
        run_id = thread_run_id(thread)
        with self._lock:
            self._threads.forget(run_id)
            if not self.store.paths(run_id).dir.is_dir():
                return
            with contextlib.suppress(RunNotFoundError):
                self.store.delete(run_id)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) whose ``metadata["run_id"]`` is listed."""
        wanted = {str(r) for r in run_ids}
        if not wanted:
            return
        with self._lock:
            for thread_id in self._threads.thread_ids():
                index = self._threads.index(thread_id)
                if index is None:
                    continue
                doomed = {e.name for e in index.entries.values() if e.run_id in wanted}
                if doomed:
                    self._threads.delete_files(thread_id, doomed)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint (same ids, parents, metadata) and write to another thread."""
        import msgspec  # noqa: PLC0415

        from afk_local.integrations.langgraph.threads import thread_run_id  # noqa: PLC0415
        from afk_local.integrations.langgraph.writes import encode_writes  # noqa: PLC0415

        source, target = str(source_thread_id), str(target_thread_id)
        if source == target:
            return
        with self._lock:
            index = self._threads.index(source)
            if index is None or not index.by_key:
                return
            writes = self._threads.load_writes(thread_run_id(source))
            handle = self._threads.handle(target)
            chunks = []
            for entry in sorted(index.by_key.values(), key=lambda e: e.seq):
                record = index.reader.load(entry.file)
                payload = index.payload(record.payload, entry)
                copied = msgspec.structs.replace(payload, thread_id=target)
                self._threads.write_checkpoint(handle, copied, record.step)
                key = (entry.ns, entry.checkpoint_id)
                chunks += encode_writes(entry.ns, entry.checkpoint_id, writes.get(key, {}))
            if chunks:
                self._threads.append_writes(handle, b"".join(chunks))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Drop old checkpoints of ``thread_ids``.

        Args:
            thread_ids: threads to prune; unknown ones are ignored.
            strategy: ``"keep_latest"`` keeps the newest checkpoint of each
                namespace (and its writes); ``"delete"`` removes the threads.

        Raises:
            ValueError: an unknown strategy.
        """
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"unknown prune strategy {strategy!r}: use 'keep_latest' or 'delete'")
        with self._lock:
            for thread_id in (str(t) for t in thread_ids):
                if strategy == "delete":
                    self.delete_thread(thread_id)
                    continue
                index = self._threads.index(thread_id)
                if index is None:
                    continue
                newest: dict[str, IndexEntry] = {}
                for entry in index.by_key.values():
                    if (
                        entry.ns not in newest
                        or newest[entry.ns].checkpoint_id < entry.checkpoint_id
                    ):
                        newest[entry.ns] = entry
                keep = {e.name for e in newest.values()}
                doomed = set(index.entries) - keep
                if doomed:
                    self._threads.delete_files(thread_id, doomed)

    def get_next_version(self, current: str | int | None, channel: None) -> str:
        """The next channel version: a zero-padded counter and a random tiebreak (sortable)."""
        if current is None:
            number = 0
        elif isinstance(current, int):
            number = current
        else:
            number = int(current.split(".")[0])
        return f"{number + 1:032}.{random.random():016}"

    # -- async API (the disk work runs in a worker thread) ------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Async :meth:`get_tuple`."""
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Async :meth:`list`."""
        found = await asyncio.to_thread(
            self._list, config, filter=filter, before=before, limit=limit
        )
        for item in found:
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Async :meth:`put`."""
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Async :meth:`put_writes`."""
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        """Async :meth:`delete_thread`."""
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Async :meth:`delete_for_runs`."""
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Async :meth:`copy_thread`."""
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Async :meth:`prune`."""
        await asyncio.to_thread(self.prune, thread_ids, strategy=strategy)

    # -- values -------------------------------------------------------------------

    def _loads(self, typed: Typed) -> Any:
        if typed[0] == "pickle":
            raise ValueError(
                "refusing to load a pickled LangGraph value: afk_local never unpickles "
                "(pass a serde that decodes it yourself if you trust the file)"
            )
        return self.serde.loads_typed(typed)

    def _tuple(
        self,
        thread_id: str,
        index: ThreadIndex,
        entry: IndexEntry,
        *,
        one: bool = True,
        payload: Payload | None = None,
    ) -> CheckpointTuple:
        if payload is None:  # else: loaded and checked by the caller
            payload = index.payload(index.reader.load(entry.file).payload, entry)
        if payload.thread_id != thread_id or payload.ns != entry.ns:
            from afk_local.errors import CheckpointCorruptionError  # noqa: PLC0415

            raise CheckpointCorruptionError(
                index.reader.location(entry.file),
                f"holds thread {payload.thread_id!r}, namespace {payload.ns!r}, not what the "
                "index expected there",
                index.reader.run_id,
            )
        run_id = index.reader.run_id
        if one:  # one checkpoint asked for: read only its writes
            writes = self._threads.checkpoint_writes(
                run_id, entry.ns, entry.checkpoint_id, payload.writes_from
            )
        else:
            writes = self._threads.load_writes(run_id).get((entry.ns, entry.checkpoint_id), {})
        ordered = sorted(writes.items(), key=lambda kv: writes_sort_key(kv[1][3], *kv[0]))
        parent_config: RunnableConfig | None = None
        if payload.parent:
            parent_config = {
                "configurable": {
                    "thread_id": thread_id,
                    "checkpoint_ns": payload.ns,
                    "checkpoint_id": payload.parent,
                }
            }
        return CheckpointTuple(
            config={
                "configurable": {
                    "thread_id": thread_id,
                    "checkpoint_ns": payload.ns,
                    "checkpoint_id": payload.id,
                }
            },
            checkpoint=self._loads(payload.checkpoint),
            metadata=self._loads(payload.metadata),
            parent_config=parent_config,
            pending_writes=[
                (task_id, channel, self._loads(typed))
                for _, (task_id, channel, typed, _path) in ordered
            ],
        )


__all__ = [
    "INDEX_NAME",
    "INTEGRATION",
    "PHASE",
    "RUN_PREFIX",
    "WRITES_NAME",
    "AfkLocalSaver",
    "thread_run_id",
]
