"""Reading LangGraph threads from their run directories: which threads exist, a thread's
index, its newest checkpoint without a lock, and its pending writes.

The lowest part of :class:`~afk_local.integrations.langgraph.threads.ThreadFiles`, which
adds the writers (a thread's handle, its checkpoints and writes, closing, deleting).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections import OrderedDict
from typing import TYPE_CHECKING

import msgspec

from afk_local.errors import AfkLocalError
from afk_local.integrations.langgraph.index import (
    INDEX_NAME,
    PHASE,
    IndexEntry,
    Payload,
    ThreadIndex,
    newest_in_cache,
    read_index_cache,
    scan_thread_files,
)
from afk_local.integrations.langgraph.writes import (
    WRITES_NAME,
    CheckpointWrites,
    PendingWrites,
    TaskWrites,
    WritesMark,
    read_checkpoint_writes,
    read_writes,
    read_writes_after,
)
from afk_local.storage import fsio
from afk_local.storage.format.layout import (
    RunPaths,
    checkpoint_name,
    parse_checkpoint_name,
    validate_run_id,
)
from afk_local.storage.rundir.read.reader import RunReader
from afk_local.storage.store import Store

if TYPE_CHECKING:
    from afk_local.storage.rundir.write.writer import RunWriter

log = logging.getLogger("afk_local")

RUN_PREFIX = "lg-"
"""Run ids of LangGraph threads start with this."""


INTEGRATION = "langgraph"
"""Value of ``RunMeta.extra["integration"]`` for runs written by the LangGraph saver."""


_SLUG_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


_SLUG_MAX = 80


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


class ThreadHandle(msgspec.Struct):
    """An open thread: its run writer (holding ``owner.lock``) and its side files."""

    thread_id: str
    writer: RunWriter
    writes_fd: int | None = None
    index_fd: int | None = None
    tops: dict[str, str] | None = None
    """The greatest checkpoint id of each namespace among the thread's checkpoint files
    (None: not known yet; every write keeps it current)."""
    tops_known: bool = True
    """False when the index could not be built: no checkpoint is marked ``top`` then."""
    writes_mark: WritesMark | None = None
    """Where the writes file ends, while :attr:`writes_fd` is open (None: not known)."""


class ThreadReads:
    """The reading side of a store's LangGraph threads (see ``ThreadFiles``)."""

    def __init__(self, store: Store, *, lock_timeout: float, max_open_threads: int) -> None:
        self.store = store
        self.lock_timeout = lock_timeout
        self.max_open_threads = max(1, max_open_threads)
        self._handles: OrderedDict[str, ThreadHandle] = OrderedDict()
        self._indexes: dict[str, ThreadIndex] = {}
        self._writes: dict[str, PendingWrites] = {}

    def thread_ids(self) -> list[str]:
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

    def index(self, thread_id: str) -> ThreadIndex | None:
        """The index of ``thread_id``'s checkpoint files (None when it has no run directory)."""
        run_id = thread_run_id(thread_id)
        paths = self.store.paths(run_id)
        index = self._indexes.get(run_id)
        reader = index.reader if index is not None else self._reader(paths)
        found = scan_thread_files(paths.dir, reader.catalog)
        if found is None:
            self._indexes.pop(run_id, None)
            return None
        if index is None or index.is_stale(found):
            # A file vanished or was replaced: start over (appends keep the cache).
            index = ThreadIndex(reader if index is None else self._reader(paths))
            self._indexes[run_id] = index
        index.update(found, thread_id)
        return index

    def newest_cold(
        self, thread_id: str, ns: str
    ) -> tuple[ThreadIndex, IndexEntry, Payload | None] | None:
        """A new process's first look at a thread's newest checkpoint of ``ns``, without
        listing the directory or building the index. ``latest`` names the newest file (a
        file at the next seq means a crash left it behind: None). Its checkpoint is
        loaded; when it is of ``ns`` and was written as the top of ``ns``
        (:attr:`Payload.top`), it is the answer, with its payload: nothing written after
        it can be newer, and deleting checkpoints only removes them and moves ``latest``
        to the newest survivor. Else the index cache answers when it records every seq
        up to ``latest``'s; the payload is returned only when that answer is ``latest``,
        and the entry is otherwise checked against its file when loaded.

        The ``top`` shortcut is taken also when this process holds the thread's index
        (it costs one file its reader has usually decoded already; refreshing the index
        lists the directory), the cache only when it does not.

        None when neither can tell (a keyed store, no usable ``latest``, an old or
        incomplete cache, or the thread already indexed): the caller uses the index.
        """
        run_id = thread_run_id(thread_id)
        if self.store.codec.signer is not None:
            return None
        indexed = self._indexes.get(run_id)
        paths = self.store.paths(run_id)
        target = fsio.read_link(paths.latest)
        latest = parse_checkpoint_name(target) if target else None
        if latest is None or latest.phase != PHASE:
            return None
        if os.path.lexists(paths.dir / checkpoint_name(latest.seq + 1, PHASE)):
            return None  # latest lags behind a newer file (a crash): list
        index = indexed if indexed is not None else ThreadIndex(self._reader(paths))
        try:
            payload: Payload | None = index.payload(index.reader.load(latest).payload, latest)
        except (AfkLocalError, OSError):
            payload = None  # the slower paths decide, and report what is wrong
        if payload is not None and payload.thread_id == thread_id:
            if payload.top and payload.ns == ns:
                return index, IndexEntry.of(latest, -1, payload), payload
        else:
            payload = None
        if indexed is not None:
            return None  # the index this process holds answers (refreshed by one listing)
        entry = newest_in_cache(read_index_cache(paths.dir / INDEX_NAME), latest, ns)
        if entry is None:
            return None
        return index, entry, payload if entry.name == latest.name else None

    def _reader(self, paths: RunPaths) -> RunReader:
        return RunReader(
            paths, record_codec=self.store.codec, max_record_bytes=self.store.max_record_bytes
        )

    def load_writes(self, run_id: str) -> CheckpointWrites:
        """The pending writes of a thread's run by ``(ns, checkpoint_id)``."""
        return self._writes_state(run_id).by_checkpoint

    def checkpoint_writes(
        self, run_id: str, ns: str, checkpoint_id: str, mark: WritesMark | None = None
    ) -> TaskWrites:
        """The pending writes of one checkpoint: from the parsed writes file when this
        process has read it, else by reading only that checkpoint's frames (only those
        after ``mark``, the checkpoint's :attr:`Payload.writes_from`, when it holds)."""
        if run_id not in self._writes:
            path = self.store.paths(run_id).dir / WRITES_NAME
            limit = self.store.max_record_bytes
            found = None
            if mark is not None:
                found = read_writes_after(path, ns, checkpoint_id, mark, max_bytes=limit)
            if found is None:
                found = read_checkpoint_writes(path, ns, checkpoint_id, max_bytes=limit)
            if found is not None:
                return found
        return self.load_writes(run_id).get((ns, checkpoint_id), {})

    def _writes_state(self, run_id: str) -> PendingWrites:
        """The parsed writes file of a run, reading only what was appended since last time."""
        path = self.store.paths(run_id).dir / WRITES_NAME
        state = read_writes(
            path,
            self._writes.get(run_id),
            run_id=run_id,
            max_bytes=self.store.max_record_bytes,
        )
        if state is None:
            self._writes.pop(run_id, None)
            return PendingWrites()
        self._writes[run_id] = state
        return state
