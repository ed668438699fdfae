"""The run directories of LangGraph threads: opening, writing, deleting checkpoints.

Every LangGraph thread lives in one afk_local run directory
(``<root>/runs/lg-<thread slug>-<hash>/``). :class:`ThreadFiles` opens a
thread's :class:`afk_local.RunWriter` (holding ``owner.lock``) on first write
and keeps the least recently used threads open, writes each checkpoint file
and appends pending writes, and keeps each thread's :class:`ThreadIndex` and
:class:`PendingWrites` fresh. It knows nothing of LangGraph's configs or
serializer: :class:`afk_local.integrations.langgraph.AfkLocalSaver` does.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from afk_local.errors import AfkLocalError, RunExistsError
from afk_local.integrations.langgraph.index import (
    PHASE,
    IndexEntry,
    Payload,
    ThreadIndex,
    append_to_index_file,
    scan_thread_files,
)
from afk_local.integrations.langgraph.writes import (
    WRITES_NAME,
    PendingWrites,
    TaskWrites,
    append_writes,
    open_writes,
    read_writes,
    rewrite_writes,
)
from afk_local.storage import fsio
from afk_local.storage.layout import CheckpointFile, validate_run_id
from afk_local.storage.reader import RunReader
from afk_local.storage.records import PauseInfo, RunStatus
from afk_local.storage.retention import (
    chain_links_after_delete,
    deletion_rounds,
    read_file_facts,
    rewrite_as_keyframe,
)
from afk_local.storage.run import RunWriter
from afk_local.storage.store import Store

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


@dataclass
class ThreadHandle:
    """An open thread: its run writer (holding ``owner.lock``) and its side files."""

    thread_id: str
    writer: RunWriter
    writes_fd: int | None = None
    index_fd: int | None = None


class ThreadFiles:
    """The LangGraph threads of one store, as run directories.

    Not thread-safe: the saver calls it under one lock.

    Args:
        store: the store holding the threads.
        lock_timeout: seconds to wait for a thread's ``owner.lock`` held by
            another process before :class:`afk_local.RunLockedError`.
        max_open_threads: threads kept open (lock and descriptors held) at once;
            the least recently used are closed beyond this.
    """

    def __init__(self, store: Store, *, lock_timeout: float, max_open_threads: int) -> None:
        self.store = store
        self.lock_timeout = lock_timeout
        self.max_open_threads = max(1, max_open_threads)
        self._handles: OrderedDict[str, ThreadHandle] = OrderedDict()
        self._indexes: dict[str, ThreadIndex] = {}
        self._writes: dict[str, PendingWrites] = {}

    def close(self) -> None:
        """Close every open thread: mark it idle (``paused``) and release its lock."""
        while self._handles:
            _, handle = self._handles.popitem(last=False)
            self._close_handle(handle, idle=True)

    # -- reading --------------------------------------------------------------------

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
        found = scan_thread_files(paths.dir)
        if found is None:
            self._indexes.pop(run_id, None)
            return None
        index = self._indexes.get(run_id)
        if index is None or index.is_stale(found):
            # A file vanished or was replaced: start over (appends keep the cache).
            index = ThreadIndex(
                RunReader(
                    paths,
                    record_codec=self.store.codec,
                    max_record_bytes=self.store.max_record_bytes,
                )
            )
            self._indexes[run_id] = index
        index.update(found, thread_id)
        return index

    def load_writes(self, run_id: str) -> dict[tuple[str, str], TaskWrites]:
        """The pending writes of a thread's run by ``(ns, checkpoint_id)``."""
        return self._writes_state(run_id).by_checkpoint

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

    # -- writing --------------------------------------------------------------------

    def handle(self, thread_id: str) -> ThreadHandle:
        """The open writer of ``thread_id``, creating the run on first use."""
        run_id = thread_run_id(thread_id)
        handle = self._handles.get(run_id)
        if handle is not None:
            self._handles.move_to_end(run_id)
            return handle
        handle = ThreadHandle(thread_id, self._open_writer(run_id, thread_id))
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

    def write_checkpoint(self, handle: ThreadHandle, payload: Payload, step: int) -> None:
        """Durably write one LangGraph checkpoint file and add it to the index."""
        try:
            record = handle.writer.checkpoint(PHASE, payload, step=step)
        except BaseException:
            self._drop_handle(handle)  # a failed write poisons the writer: reopen from disk
            raise
        run_id = handle.writer.run_id
        path = handle.writer.paths.checkpoint(record.seq, PHASE)
        handle.index_fd = append_to_index_file(handle.index_fd, path, payload, run_id)
        index = self._indexes.get(run_id)
        if index is not None:
            file = CheckpointFile(record.seq, PHASE, path.name)
            ino = os.stat(path, follow_symlinks=False).st_ino
            index.add(IndexEntry.of(file, ino, payload))

    def append_writes(self, handle: ThreadHandle, data: bytes) -> None:
        """Append framed pending writes to the thread's writes file, fsynced."""
        path = handle.writer.paths.dir / WRITES_NAME
        try:
            if handle.writes_fd is None:
                handle.writes_fd = open_writes(
                    path, self._writes_state(handle.writer.run_id), handle.writer.run_id
                )
            append_writes(handle.writes_fd, data, path)
        except BaseException:
            self._drop_handle(handle)
            raise

    def _close_handle(self, handle: ThreadHandle, *, idle: bool) -> None:
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

    def _drop_handle(self, handle: ThreadHandle) -> None:
        run_id = handle.writer.run_id
        if self._handles.get(run_id) is handle:
            del self._handles[run_id]
        self._indexes.pop(run_id, None)
        self._writes.pop(run_id, None)
        self._close_handle(handle, idle=False)

    def forget(self, run_id: str, *, idle: bool = False) -> None:
        """Close the thread's handle and drop every cache of it."""
        handle = self._handles.pop(run_id, None)
        if handle is not None:
            self._close_handle(handle, idle=idle)
        self._indexes.pop(run_id, None)
        self._writes.pop(run_id, None)

    # -- deleting single checkpoints ----------------------------------------------

    def delete_files(self, thread_id: str, doomed: set[str]) -> None:
        """Delete checkpoint files ``doomed`` of a thread, and the writes of checkpoints gone.

        Crash-safe in the order of afk_local's compaction: in a keyed store the
        chain links of survivors go into ``run.meta`` first, kept deltas whose base
        goes away are rewritten as keyframes (same decoded bytes), then files are
        deleted in durable rounds, a delta before its base (``deletion_rounds``), then
        the writes file is replaced atomically.
        """
        run_id = thread_run_id(thread_id)
        handle = self.handle(thread_id)  # holds the lock for the whole operation
        try:
            index = self.index(thread_id)
            if index is None:
                return
            paths = handle.writer.paths
            files = sorted(CheckpointFile(e.seq, PHASE, e.name) for e in index.entries.values())
            facts = {f.seq: f for f in read_file_facts(paths.dir, files)}
            doomed_seqs = {f.seq for f in files if f.name in doomed}
            index.reader.refresh()
            survivors = [f for f in files if f.seq not in doomed_seqs]
            extra = chain_links_after_delete(index.reader, doomed_seqs, survivors)
            if extra is not None:
                handle.writer.update_meta(extra=extra)
            for fact in facts.values():
                if fact.seq in doomed_seqs or not fact.base_seq:
                    continue
                if fact.base_seq in doomed_seqs or fact.base_seq not in facts:
                    rewrite_as_keyframe(
                        index.reader, CheckpointFile(fact.seq, fact.phase, fact.name)
                    )
            keyed = index.reader.record_codec.signer is not None
            for batch in deletion_rounds([facts[s] for s in doomed_seqs], keyed=keyed):
                for fact in batch:
                    fsio.unlink(paths.dir / fact.name)
                fsio.fsync_dir(paths.dir)
            kept = [f for f in files if f.seq not in doomed_seqs]
            if kept:
                fsio.atomic_symlink(kept[-1].name, paths.latest, sync_dir=False)
            else:
                fsio.unlink(paths.latest)
            fsio.fsync_dir(paths.dir)
            handle.writer.anchor_head()  # deleted on purpose: not a rollback
            remaining = {
                (e.ns, e.checkpoint_id) for e in index.entries.values() if e.name not in doomed
            }
            rewrite_writes(paths.dir / WRITES_NAME, self.load_writes(run_id), remaining)
        finally:
            # The writer's delta base may be gone and caches are stale: reopen on next use.
            self.forget(run_id, idle=True)


__all__: Sequence[str] = [
    "INTEGRATION",
    "RUN_PREFIX",
    "ThreadFiles",
    "ThreadHandle",
    "thread_run_id",
]
