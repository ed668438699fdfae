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
import hashlib
import logging
import os
import random
import re
import struct
import threading
import zlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

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

from afk_local import codec, fsio
from afk_local.errors import (
    AfkLocalError,
    CheckpointCorruptionError,
    RunExistsError,
    RunNotFoundError,
)
from afk_local.layout import CheckpointFile, parse_checkpoint_name, validate_run_id
from afk_local.reader import RunReader
from afk_local.records import PauseInfo, RunStatus
from afk_local.retention import read_file_facts
from afk_local.run import RunWriter
from afk_local.store import Store

log = logging.getLogger("afk_local")

PHASE = "langgraph"
"""The phase of the checkpoint files that hold LangGraph checkpoints."""

WRITES_NAME = "langgraph.writes"
"""The append-only pending-writes file inside a thread's run directory."""

INDEX_NAME = "langgraph.index"
"""A cache of each checkpoint file's ids and metadata, so a new process need not decode them all."""

RUN_PREFIX = "lg-"
"""Run ids of LangGraph threads start with this."""

INTEGRATION = "langgraph"
"""Value of ``RunMeta.extra["integration"]`` for runs written by :class:`AfkLocalSaver`."""

PAYLOAD_FORMAT = 1
_FRAME_HEADER = struct.Struct("<II")  # length (u32 LE) | crc32 of the body (u32 LE)
_SLUG_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_SLUG_MAX = 80
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)

Typed = tuple[str, bytes]


def thread_run_id(thread_id: str) -> str:
    """The afk_local run id that stores LangGraph thread ``thread_id``.

    Run ids allow only ``[A-Za-z0-9._-]``: the readable part keeps the safe
    characters of the thread id (others become ``_``), and a blake2b suffix of
    the exact thread id keeps distinct threads apart. The exact thread id is
    stored in the run's ``run.meta`` and in every checkpoint, so the mapping can
    be reversed.

    Example:
        >>> thread_run_id("user/42").startswith("lg-user_42-")
        True
    """
    slug = _SLUG_UNSAFE.sub("_", thread_id)[:_SLUG_MAX]
    digest = hashlib.blake2b(thread_id.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()
    return validate_run_id(f"{RUN_PREFIX}{slug}-{digest}")


class _Payload(msgspec.Struct, kw_only=True, frozen=True):
    """The payload of one ``langgraph`` checkpoint file."""

    format: int
    thread_id: str
    ns: str
    id: str
    parent: str | None
    checkpoint: tuple[str, bytes]
    metadata: tuple[str, bytes]
    run_id: str | None = None


# One put_writes call: (ns, checkpoint_id, task_id, task_path, [(idx, channel, type, bytes)])
_WriteFrame = tuple[str, str, str, str, list[tuple[int, str, str, bytes]]]
_WRITE_DECODER = msgspec.msgpack.Decoder(_WriteFrame)
# One checkpoint file: (file name, crc32 from its AFK1 header, ns, id, parent, run_id, metadata)
_IndexFrame = tuple[str, int, str, str, str | None, str | None, tuple[str, bytes]]
_INDEX_DECODER = msgspec.msgpack.Decoder(_IndexFrame)
_ENCODER = msgspec.msgpack.Encoder()


def _frame(body: bytes) -> bytes:
    return _FRAME_HEADER.pack(len(body), zlib.crc32(body)) + body


@dataclass(frozen=True)
class _Entry:
    """One ``langgraph`` checkpoint file, as the index knows it (no values)."""

    seq: int
    name: str
    ino: int
    ns: str
    checkpoint_id: str
    parent_id: str | None
    metadata: Typed
    run_id: str | None


@dataclass
class _Index:
    """The checkpoint files of one thread, rebuilt from a directory scan."""

    reader: RunReader
    entries: dict[str, _Entry] = field(default_factory=dict)
    by_key: dict[tuple[str, str], _Entry] = field(default_factory=dict)

    def add(self, entry: _Entry) -> None:
        self.entries[entry.name] = entry
        key = (entry.ns, entry.checkpoint_id)
        current = self.by_key.get(key)
        if current is None or current.seq < entry.seq:  # a re-put id: the newest file wins
            self.by_key[key] = entry


@dataclass
class _Writes:
    """Parsed ``langgraph.writes`` of one thread, extended as the file grows."""

    ino: int = -1
    offset: int = 0
    # (ns, checkpoint_id) -> (task_id, idx) -> (task_id, channel, typed value, task_path)
    by_checkpoint: dict[tuple[str, str], dict[tuple[str, int], tuple[str, str, Typed, str]]] = (
        field(default_factory=dict)
    )

    def apply(self, frame: _WriteFrame) -> None:
        ns, checkpoint_id, task_id, task_path, items = frame
        slot = self.by_checkpoint.setdefault((ns, checkpoint_id), {})
        for idx, channel, type_, data in items:
            key = (task_id, idx)
            if idx >= 0 and key in slot:
                continue  # regular writes: the first one wins (a retried task writes again)
            slot[key] = (task_id, channel, (type_, data), task_path)  # special: the last wins


@dataclass
class _Handle:
    """An open thread: its run writer (holding ``owner.lock``) and the writes file."""

    thread_id: str
    writer: RunWriter
    writes_fd: int | None = None
    index_fd: int | None = None


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
        super().__init__(serde=serde or JsonPlusSerializer(pickle_fallback=False))
        self.store = store if isinstance(store, Store) else Store(store)
        self.lock_timeout = lock_timeout
        self.max_open_threads = max(1, max_open_threads)
        self._lock = threading.RLock()
        self._handles: OrderedDict[str, _Handle] = OrderedDict()
        self._indexes: dict[str, _Index] = {}
        self._writes: dict[str, _Writes] = {}

    @classmethod
    def from_path(cls, path: str | os.PathLike[str], **options: Any) -> AfkLocalSaver:
        """A saver on the store at ``path``; use it as a context manager to close it.

        Example:
            >>> with AfkLocalSaver.from_path(".afk") as saver:  # doctest: +SKIP
            ...     graph = builder.compile(checkpointer=saver)
        """
        return cls(Store(path), **options)

    def __repr__(self) -> str:
        return f"AfkLocalSaver(root={str(self.store.root)!r})"

    # -- lifetime -----------------------------------------------------------------

    def close(self) -> None:
        """Close every open thread: mark it idle (``paused``) and release its lock."""
        with self._lock:
            while self._handles:
                _, handle = self._handles.popitem(last=False)
                self._close_handle(handle, idle=True)

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
        with self._lock:
            index = self._index(thread_id)
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
            threads = [str(conf["thread_id"])] if config else self._thread_ids()
            candidates: builtins.list[tuple[str, _Index, _Entry]] = []
            for thread_id in threads:
                index = self._index(thread_id)
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
                found.append(self._tuple(thread_id, index, entry))
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
        full_metadata = get_checkpoint_metadata(config, metadata)
        run_id = full_metadata.get("run_id")
        payload = _Payload(
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
            handle = self._handle(thread_id)
            self._write_checkpoint(handle, payload, step if isinstance(step, int) else 0)
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
        conf = config["configurable"]
        thread_id = str(conf["thread_id"])
        items = [
            (WRITES_IDX_MAP.get(channel, i), channel, *self.serde.dumps_typed(value))
            for i, (channel, value) in enumerate(writes)
        ]
        frame: _WriteFrame = (
            str(conf.get("checkpoint_ns", "")),
            str(conf["checkpoint_id"]),
            task_id,
            task_path,
            items,
        )
        with self._lock:
            handle = self._handle(thread_id)
            self._append_writes(handle, _frame(_ENCODER.encode(frame)))

    def delete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint and write of ``thread_id`` (its whole run directory)."""
        thread = str(thread_id)
        run_id = thread_run_id(thread)
        with self._lock:
            self._forget(run_id)
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
            for thread_id in self._thread_ids():
                index = self._index(thread_id)
                if index is None:
                    continue
                doomed = {e.name for e in index.entries.values() if e.run_id in wanted}
                if doomed:
                    self._delete_files(thread_id, doomed)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint (same ids, parents, metadata) and write to another thread."""
        source, target = str(source_thread_id), str(target_thread_id)
        if source == target:
            return
        with self._lock:
            index = self._index(source)
            if index is None or not index.by_key:
                return
            writes = self._load_writes(thread_run_id(source))
            handle = self._handle(target)
            chunks = []
            for entry in sorted(index.by_key.values(), key=lambda e: e.seq):
                record = index.reader.load(CheckpointFile(entry.seq, PHASE, entry.name))
                payload = self._payload(record.payload, index, entry)
                copied = msgspec.structs.replace(payload, thread_id=target)
                self._write_checkpoint(handle, copied, record.step)
                for (task_id, idx), (_, channel, (type_, data), task_path) in writes.get(
                    (entry.ns, entry.checkpoint_id), {}
                ).items():
                    item = [(idx, channel, type_, data)]
                    frame = (entry.ns, entry.checkpoint_id, task_id, task_path, item)
                    chunks.append(_frame(_ENCODER.encode(frame)))
            if chunks:
                self._append_writes(handle, b"".join(chunks))

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
                index = self._index(thread_id)
                if index is None:
                    continue
                newest: dict[str, _Entry] = {}
                for entry in index.by_key.values():
                    if (
                        entry.ns not in newest
                        or newest[entry.ns].checkpoint_id < entry.checkpoint_id
                    ):
                        newest[entry.ns] = entry
                keep = {e.name for e in newest.values()}
                doomed = set(index.entries) - keep
                if doomed:
                    self._delete_files(thread_id, doomed)

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

    def _tuple(self, thread_id: str, index: _Index, entry: _Entry) -> CheckpointTuple:
        record = index.reader.load(CheckpointFile(entry.seq, PHASE, entry.name))
        payload = self._payload(record.payload, index, entry)
        writes = self._load_writes(index.reader.run_id).get((entry.ns, entry.checkpoint_id), {})
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

    def _payload(self, raw: Any, index: _Index, entry: _Entry | CheckpointFile) -> _Payload:
        path = str(index.reader.paths.dir / entry.name)
        try:
            payload = msgspec.convert(raw, _Payload)
        except msgspec.ValidationError as exc:
            raise CheckpointCorruptionError(
                path, f"not a LangGraph checkpoint: {exc}", index.reader.run_id
            ) from None
        if payload.format > PAYLOAD_FORMAT:
            raise CheckpointCorruptionError(
                path,
                f"LangGraph payload format {payload.format} is newer than this afk_local "
                f"({PAYLOAD_FORMAT}): upgrade afk_local",
                index.reader.run_id,
            )
        if isinstance(entry, _Entry) and payload.id != entry.checkpoint_id:
            raise CheckpointCorruptionError(
                path, "file changed under the index (another process pruned the thread?)"
            )
        return payload

    # -- the index of a thread's checkpoint files ---------------------------------

    def _thread_ids(self) -> builtins.list[str]:
        """Every thread stored in this store (from the runs' ``run.meta``)."""
        threads = []
        for run_id in self.store.run_ids():
            if not run_id.startswith(RUN_PREFIX):
                continue
            try:
                meta = self.store.read_meta(run_id)
            except AfkLocalError:
                continue
            if meta.extra.get("integration") == INTEGRATION and meta.thread_id is not None:
                threads.append(meta.thread_id)
        return threads

    def _index(self, thread_id: str) -> _Index | None:
        """The index of ``thread_id``'s checkpoint files (None when it has no run directory)."""
        run_id = thread_run_id(thread_id)
        paths = self.store.paths(run_id)
        found: dict[str, tuple[CheckpointFile, int]] = {}
        try:
            with os.scandir(paths.dir) as entries:
                for item in entries:
                    parsed = parse_checkpoint_name(item.name)
                    if parsed and parsed.phase == PHASE and item.is_file(follow_symlinks=False):
                        found[item.name] = (parsed, item.inode())
        except FileNotFoundError:
            self._indexes.pop(run_id, None)
            return None
        index = self._indexes.get(run_id)
        if index is None or any(
            name not in found or found[name][1] != entry.ino
            for name, entry in index.entries.items()
        ):
            # A file vanished or was replaced: start over (appends keep the cache).
            index = _Index(
                RunReader(
                    paths,
                    record_codec=self.store.codec,
                    max_record_bytes=self.store.max_record_bytes,
                )
            )
            self._indexes[run_id] = index
        missing = sorted(set(found) - set(index.entries))
        cached = _read_index_file(paths.dir / INDEX_NAME) if len(missing) > 1 else {}
        for name in missing:
            file, ino = found[name]
            hit = cached.get(name)
            if hit is not None and hit[1] == _header_crc(paths.dir / name):
                index.add(_entry_from_frame(file, ino, hit))
                continue
            record = index.reader.load(file)
            payload = self._payload(record.payload, index, file)
            if payload.thread_id != thread_id:
                raise AfkLocalError(
                    f"run {run_id!r} holds LangGraph thread {payload.thread_id!r}, not "
                    f"{thread_id!r} (file {paths.dir / name}): the run-id hash collided; "
                    "rename one of the threads"
                )
            index.add(_entry(file, ino, payload))
        return index

    # -- writing ------------------------------------------------------------------

    def _handle(self, thread_id: str) -> _Handle:
        """The open writer of ``thread_id``, creating the run on first use."""
        run_id = thread_run_id(thread_id)
        handle = self._handles.get(run_id)
        if handle is not None:
            self._handles.move_to_end(run_id)
            return handle
        handle = _Handle(thread_id, self._open_writer(run_id, thread_id))
        self._handles[run_id] = handle
        while len(self._handles) > self.max_open_threads:
            _, oldest = self._handles.popitem(last=False)
            self._close_handle(oldest, idle=True)
        return handle

    def _open_writer(self, run_id: str, thread_id: str) -> RunWriter:
        paths = self.store.paths(run_id)
        if paths.dir.is_dir() and not paths.meta.is_file() and not any(paths.dir.glob("*.ckpt")):
            # A crash between mkdir and the first run.meta: nothing was stored yet.
            log.info("run %s: removing a run directory left half-created by a crash", run_id)
            self.store.delete(run_id)
        if not paths.meta.is_file():
            try:
                return self.store.create(
                    run_id, thread_id=thread_id, extra={"integration": INTEGRATION}
                )
            except RunExistsError:
                pass  # created by someone else meanwhile
        meta = self.store.read_meta(run_id)
        if meta.thread_id != thread_id:
            raise AfkLocalError(
                f"run {run_id!r} holds LangGraph thread {meta.thread_id!r}, not {thread_id!r} "
                f"({paths.meta}): the run-id hash collided; rename one of the threads"
            )
        return self.store.resume_writer(run_id, lock_timeout=self.lock_timeout)

    def _write_checkpoint(self, handle: _Handle, payload: _Payload, step: int) -> None:
        try:
            record = handle.writer.checkpoint(PHASE, payload, step=step)
        except BaseException:
            self._drop_handle(handle)  # a failed write poisons the writer: reopen from disk
            raise
        run_id = handle.writer.run_id
        path = handle.writer.paths.checkpoint(record.seq, PHASE)
        self._append_index(handle, path, payload)
        index = self._indexes.get(run_id)
        if index is not None:
            file = CheckpointFile(record.seq, PHASE, path.name)
            ino = os.stat(path, follow_symlinks=False).st_ino
            index.add(_entry(file, ino, payload))

    def _append_index(self, handle: _Handle, path: Path, payload: _Payload) -> None:
        """Add a checkpoint to the index cache (not fsynced: a lost entry is only a miss)."""
        crc = _header_crc(path)
        if crc is None:
            return
        frame: _IndexFrame = (
            path.name,
            crc,
            payload.ns,
            payload.id,
            payload.parent,
            payload.run_id,
            payload.metadata,
        )
        index_path = path.parent / INDEX_NAME
        try:
            if handle.index_fd is None:
                fd = fsio.open_append(index_path)
                good = _index_good_end(index_path)
                if os.fstat(fd).st_size > good:  # a torn tail would hide every later entry
                    fsio.truncate(fd, good, index_path)
                handle.index_fd = fd
            fsio.write_all(handle.index_fd, _frame(_ENCODER.encode(frame)), index_path)
        except OSError as exc:
            log.warning(
                "run %s: index cache %s not updated: %s", handle.writer.run_id, index_path, exc
            )

    def _append_writes(self, handle: _Handle, data: bytes) -> None:
        path = handle.writer.paths.dir / WRITES_NAME
        try:
            if handle.writes_fd is None:
                handle.writes_fd = self._open_writes(handle, path)
            fsio.write_all(handle.writes_fd, data, path)
            fsio.fsync_fd(handle.writes_fd, path)
        except BaseException:
            self._drop_handle(handle)
            raise

    def _open_writes(self, handle: _Handle, path: Path) -> int:
        """Open the writes file for appending, cutting a torn tail a crash left behind."""
        existed = path.exists()
        fd = fsio.open_append(path)
        try:
            state = self._writes_state(handle.writer.run_id)
            size = os.fstat(fd).st_size
            if state.ino == os.fstat(fd).st_ino and size > state.offset:
                log.warning(
                    "run %s: cutting a torn tail of %d bytes off %s (a crash cut an append)",
                    handle.writer.run_id,
                    size - state.offset,
                    path,
                )
                fsio.truncate(fd, state.offset, path)
            if not existed:
                fsio.fsync_dir(path.parent)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _close_handle(self, handle: _Handle, *, idle: bool) -> None:
        try:
            if idle and not handle.writer.closed:
                with contextlib.suppress(AfkLocalError, OSError):
                    handle.writer.update_meta(
                        status=RunStatus.PAUSED,
                        pause=PauseInfo(
                            kind="langgraph_idle",
                            prompt=f"invoke the graph with thread_id={handle.thread_id!r}",
                        ),
                    )
        finally:
            for fd in (handle.writes_fd, handle.index_fd):
                if fd is not None:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            handle.writes_fd = handle.index_fd = None
            handle.writer.close()

    def _drop_handle(self, handle: _Handle) -> None:
        run_id = handle.writer.run_id
        if self._handles.get(run_id) is handle:
            del self._handles[run_id]
        self._indexes.pop(run_id, None)
        self._writes.pop(run_id, None)
        self._close_handle(handle, idle=False)

    def _forget(self, run_id: str, *, idle: bool = False) -> None:
        """Close the thread's handle and drop every cache of it."""
        handle = self._handles.pop(run_id, None)
        if handle is not None:
            self._close_handle(handle, idle=idle)
        self._indexes.pop(run_id, None)
        self._writes.pop(run_id, None)

    # -- deleting single checkpoints ----------------------------------------------

    def _delete_files(self, thread_id: str, doomed: set[str]) -> None:
        """Delete checkpoint files ``doomed`` of a thread, and the writes of checkpoints gone.

        Crash-safe in the order of afk_local's compaction: kept deltas whose base
        goes away are first rewritten as keyframes (same decoded bytes), then files
        are deleted highest seq first, then the writes file is replaced atomically.
        """
        run_id = thread_run_id(thread_id)
        handle = self._handle(thread_id)  # holds the lock for the whole operation
        try:
            index = self._index(thread_id)
            if index is None:
                return
            paths = handle.writer.paths
            files = sorted(CheckpointFile(e.seq, PHASE, e.name) for e in index.entries.values())
            facts = {f.seq: f for f in read_file_facts(paths.dir, files)}
            doomed_seqs = {f.seq for f in files if f.name in doomed}
            for fact in facts.values():
                if fact.seq in doomed_seqs or not fact.base_seq:
                    continue
                if fact.base_seq in doomed_seqs or fact.base_seq not in facts:
                    raw = index.reader._chain.raw(
                        fact.seq, fact.name
                    )  # exact bytes: kept deltas use them
                    frame = codec.pack_frame(codec.KIND_CHECKPOINT, codec.compress(raw))
                    fsio.atomic_write(paths.dir / fact.name, frame)
            for seq in sorted(doomed_seqs, reverse=True):
                fsio.unlink(paths.dir / facts[seq].name)
            kept = [f for f in files if f.seq not in doomed_seqs]
            if kept:
                fsio.atomic_symlink(kept[-1].name, paths.latest, sync_dir=False)
            else:
                fsio.unlink(paths.latest)
            fsio.fsync_dir(paths.dir)
            remaining = {
                (e.ns, e.checkpoint_id) for e in index.entries.values() if e.name not in doomed
            }
            self._rewrite_writes(run_id, paths.dir / WRITES_NAME, remaining)
        finally:
            # The writer's delta base may be gone and caches are stale: reopen on next use.
            self._forget(run_id, idle=True)

    def _rewrite_writes(self, run_id: str, path: Path, keep: set[tuple[str, str]]) -> None:
        state = self._load_writes(run_id)
        if all(key in keep for key in state):
            return
        chunks = []
        for key, slot in state.items():
            if key not in keep:
                continue
            for (task_id, idx), (_, channel, (type_, data), task_path) in slot.items():
                frame = (key[0], key[1], task_id, task_path, [(idx, channel, type_, data)])
                chunks.append(_frame(_ENCODER.encode(frame)))
        fsio.atomic_write(path, b"".join(chunks))

    # -- reading the writes file --------------------------------------------------

    def _load_writes(
        self, run_id: str
    ) -> dict[tuple[str, str], dict[tuple[str, int], tuple[str, str, Typed, str]]]:
        return self._writes_state(run_id).by_checkpoint

    def _writes_state(self, run_id: str) -> _Writes:
        """The parsed writes file of a run, reading only what was appended since last time."""
        path = self.store.paths(run_id).dir / WRITES_NAME
        state = self._writes.get(run_id)
        try:
            fd = os.open(path, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC)
        except FileNotFoundError:
            self._writes.pop(run_id, None)
            return _Writes()
        try:
            stat = os.fstat(fd)
            if state is None or state.ino != stat.st_ino or stat.st_size < state.offset:
                state = _Writes(ino=stat.st_ino)
                self._writes[run_id] = state
            if stat.st_size > self.store.max_record_bytes:
                raise CheckpointCorruptionError(
                    str(path),
                    f"{stat.st_size} bytes, over max_record_bytes; prune the thread",
                    run_id,
                )
            if stat.st_size > state.offset:
                data = _pread_all(fd, state.offset, stat.st_size - state.offset)
                self._parse_writes(state, data, str(path), run_id)
        finally:
            os.close(fd)
        return state

    def _parse_writes(self, state: _Writes, data: bytes, path: str, run_id: str) -> None:
        pos = 0
        while pos < len(data):
            bad = _bad_frame(data, pos, self.store.max_record_bytes)
            if bad is None:
                length, _ = _FRAME_HEADER.unpack_from(data, pos)
                body = data[pos + _FRAME_HEADER.size : pos + _FRAME_HEADER.size + length]
                try:
                    frame = _WRITE_DECODER.decode(body)
                except msgspec.DecodeError as exc:
                    bad = f"record does not decode: {exc}"
                else:
                    state.apply(frame)
                    pos += _FRAME_HEADER.size + length
                    state.offset += _FRAME_HEADER.size + length
                    continue
            if _has_valid_frame_after(data, pos, self.store.max_record_bytes):
                raise CheckpointCorruptionError(
                    path,
                    f"bad frame at offset {state.offset} ({bad}) followed by good ones: the "
                    "file is damaged, not torn; restore it or delete the thread",
                    run_id,
                )
            return  # a torn tail: a crash interrupted the last append; it never returned


def _entry(file: CheckpointFile, ino: int, payload: _Payload) -> _Entry:
    return _Entry(
        seq=file.seq,
        name=file.name,
        ino=ino,
        ns=payload.ns,
        checkpoint_id=payload.id,
        parent_id=payload.parent,
        metadata=payload.metadata,
        run_id=payload.run_id,
    )


def _entry_from_frame(file: CheckpointFile, ino: int, frame: _IndexFrame) -> _Entry:
    name, _crc, ns, checkpoint_id, parent, run_id, metadata = frame
    return _Entry(file.seq, name, ino, ns, checkpoint_id, parent, metadata, run_id)


def _header_crc(path: Path) -> int | None:
    """The crc32 field of an AFK1 file's header (identifies its exact bytes), or None."""
    try:
        fd = os.open(path, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC)
    except OSError:
        return None
    try:
        head = os.pread(fd, codec.HEADER_SIZE, 0)
    finally:
        os.close(fd)
    if len(head) < codec.HEADER_SIZE:
        return None
    crc: int = struct.unpack_from("<I", head, codec.HEADER_SIZE - 4)[0]
    return crc


_MAX_INDEX_BYTES = 256 << 20


def _index_frames(path: Path) -> tuple[list[_IndexFrame], int]:
    """The readable frames of an index cache file and where they end (first bad frame)."""
    try:
        data = fsio.read_bounded(path, _MAX_INDEX_BYTES)
    except (OSError, ValueError):
        return [], 0
    frames: list[_IndexFrame] = []
    pos = 0
    while pos < len(data) and _bad_frame(data, pos, _MAX_INDEX_BYTES) is None:
        length, _ = _FRAME_HEADER.unpack_from(data, pos)
        body = data[pos + _FRAME_HEADER.size : pos + _FRAME_HEADER.size + length]
        try:
            frames.append(_INDEX_DECODER.decode(body))
        except msgspec.DecodeError:
            break
        pos += _FRAME_HEADER.size + length
    return frames, pos


def _read_index_file(path: Path) -> dict[str, _IndexFrame]:
    """Index cache entries by file name (the newest entry of a name wins)."""
    return {frame[0]: frame for frame in _index_frames(path)[0]}


def _index_good_end(path: Path) -> int:
    return _index_frames(path)[1]


def _bad_frame(data: bytes, pos: int, max_bytes: int) -> str | None:
    """Why the frame at ``pos`` is unusable, or None when its length and crc check out."""
    if len(data) - pos < _FRAME_HEADER.size:
        return "short header"
    length, crc = _FRAME_HEADER.unpack_from(data, pos)
    if length == 0 or length > max_bytes:
        return f"bad length {length}"
    start = pos + _FRAME_HEADER.size
    if start + length > len(data):
        return "short body"
    if zlib.crc32(data[start : start + length]) != crc:
        return "crc32 mismatch"
    return None


def _has_valid_frame_after(data: bytes, pos: int, max_bytes: int) -> bool:
    """True when a well-formed frame starts somewhere after the bad one at ``pos``."""
    for start in range(pos + 1, len(data) - _FRAME_HEADER.size):
        if _bad_frame(data, start, max_bytes) is None:
            return True
    return False


def _pread_all(fd: int, offset: int, size: int) -> bytes:
    chunks = []
    while size > 0:
        chunk = os.pread(fd, size, offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
        size -= len(chunk)
    return b"".join(chunks)


__all__ = [
    "INDEX_NAME",
    "INTEGRATION",
    "PHASE",
    "RUN_PREFIX",
    "WRITES_NAME",
    "AfkLocalSaver",
    "thread_run_id",
]
