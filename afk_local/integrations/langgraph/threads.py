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
from typing import TYPE_CHECKING

import msgspec

from afk_local.errors import AfkLocalError, RunExistsError
from afk_local.integrations.langgraph.index import (
    INDEX_NAME,
    PHASE,
    IndexEntry,
    Payload,
    ThreadIndex,
    append_to_index_file,
    newest_in_cache,
    read_index_cache,
    record_deletions,
    scan_thread_files,
)
from afk_local.integrations.langgraph.writes import (
    WRITES_NAME,
    CheckpointWrites,
    PendingWrites,
    TaskWrites,
    WritesMark,
    append_writes,
    mark_after,
    open_writes,
    read_checkpoint_writes,
    read_writes,
    read_writes_after,
    rewrite_writes,
    state_mark,
)
from afk_local.storage import fsio
from afk_local.storage.format.layout import (
    CheckpointFile,
    RunPaths,
    checkpoint_name,
    parse_checkpoint_name,
    validate_run_id,
)
from afk_local.storage.format.records import PauseInfo, RunStatus
from afk_local.storage.rundir.read.reader import RunReader
from afk_local.storage.store import Store

# The writer (filelock, the journal, packing) and retention are imported where a thread
# is first written or pruned: a process that only reads its threads never loads them.
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
        if (
            paths.dir.is_dir()
            and not paths.meta.is_file()
            and not any(paths.dir.glob("*.ckpt"))
            and not any(paths.dir.glob("*.pack"))
        ):
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
        """Durably write one LangGraph checkpoint file and add it to the index.

        The payload's ``top`` is set here, from every checkpoint of the thread: a caller's
        value is never trusted (a copied checkpoint was the top of another thread).
        """
        tops = self._tops(handle)
        greatest = tops.get(payload.ns)
        top = handle.tops_known and (greatest is None or payload.id >= greatest)
        new_id = handle.tops_known and (greatest is None or payload.id > greatest)
        # An id put before may have writes anywhere in the file: no mark for it.
        mark = handle.writes_mark if new_id and handle.writes_fd is not None else None
        if payload.top != top or payload.writes_from != mark:
            payload = msgspec.structs.replace(payload, top=top, writes_from=mark)
        try:
            record = handle.writer.checkpoint(PHASE, payload, step=step)
        except BaseException:
            self._drop_handle(handle)  # a failed write poisons the writer: reopen from disk
            raise
        if greatest is None or payload.id > greatest:
            tops[payload.ns] = payload.id
        run_id = handle.writer.run_id
        path = handle.writer.paths.checkpoint(record.seq, PHASE)
        handle.index_fd = append_to_index_file(handle.index_fd, path, payload, run_id)
        index = self._indexes.get(run_id)
        if index is not None:
            file = CheckpointFile(record.seq, PHASE, path.name)
            ino = os.stat(path, follow_symlinks=False).st_ino
            index.add(IndexEntry.of(file, ino, payload))

    def _tops(self, handle: ThreadHandle) -> dict[str, str]:
        """The greatest checkpoint id of each namespace of the thread, from its index once
        per opened writer (which holds ``owner.lock``: nobody else adds checkpoints)."""
        if handle.tops is None and self.store.codec.signer is not None:
            # A keyed store's index decodes every checkpoint (its cache is not signed),
            # and its readers never take the shortcut `top` is for: mark nothing.
            handle.tops, handle.tops_known = {}, False
        if handle.tops is None:
            tops: dict[str, str] = {}
            run_id = handle.writer.run_id
            held = run_id in self._indexes
            try:
                index = self.index(handle.thread_id)
            except (AfkLocalError, OSError) as exc:
                # Writing must not depend on old files being readable: mark nothing top.
                log.warning(
                    "thread %r: cannot index its checkpoints (%s); a new process reads "
                    "its newest checkpoint through the index",
                    handle.thread_id,
                    exc,
                )
                handle.tops_known = False
                index = None
            for entry in index.by_key.values() if index is not None else ():
                current = tops.get(entry.ns)
                if current is None or entry.checkpoint_id > current:
                    tops[entry.ns] = entry.checkpoint_id
            if not held:
                # Built for this alone: keeping it would make every later put stat and
                # add its file, and a put-only saver never reads it.
                self._indexes.pop(run_id, None)
            handle.tops = tops
        return handle.tops

    def append_writes(self, handle: ThreadHandle, data: bytes) -> None:
        """Append framed pending writes to the thread's writes file, fsynced."""
        path = handle.writer.paths.dir / WRITES_NAME
        try:
            if handle.writes_fd is None:
                state = self._writes_state(handle.writer.run_id)
                handle.writes_fd = open_writes(path, state, handle.writer.run_id)
                handle.writes_mark = state_mark(state)
            append_writes(handle.writes_fd, data, path)
            handle.writes_mark = mark_after(handle.writes_mark, data)
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
        """Delete checkpoints ``doomed`` (by name) of a thread, and the writes of those gone.

        Crash-safe in the order of afk_local's compaction: in a keyed store the chain
        links of survivors go into ``run.meta`` first; the index cache gets a durable
        tombstone per doomed name (a later checkpoint may reuse it); then
        :func:`~afk_local.storage.ops.retention.remove_checkpoints` rewrites kept deltas
        whose base goes as keyframes (same decoded bytes), republishes packs without
        the doomed entries and deletes in durable rounds; then ``latest`` moves and the
        writes file is replaced atomically.
        """
        from afk_local.storage.ops.retention import (  # noqa: PLC0415
            RunPlan,
            chain_links_after_delete,
            read_file_facts,
            remove_checkpoints,
        )

        run_id = thread_run_id(thread_id)
        handle = self.handle(thread_id)  # holds the lock for the whole operation
        try:
            index = self.index(thread_id)
            if index is None:
                return
            paths = handle.writer.paths
            files = sorted(e.file for e in index.entries.values())
            facts = read_file_facts(paths.dir, files, index.reader.catalog)
            doomed_seqs = {f.seq for f in files if f.name in doomed}
            index.reader.refresh()
            survivors = [f for f in files if f.seq not in doomed_seqs]
            extra = chain_links_after_delete(index.reader, doomed_seqs, survivors)
            if extra is not None:
                handle.writer.update_meta(extra=extra)
            by_seq = {f.seq: f for f in facts}
            keep = [f for f in facts if f.seq not in doomed_seqs]
            rewrite = [
                f
                for f in keep
                if f.base_seq and (f.base_seq in doomed_seqs or f.base_seq not in by_seq)
            ]
            handle.index_fd = record_deletions(
                handle.index_fd,
                paths.dir / INDEX_NAME,
                sorted(f.name for f in files if f.name in doomed),
            )
            remove_checkpoints(
                index.reader,
                RunPlan(
                    run_id,
                    tuple(keep),
                    tuple(rewrite),
                    tuple(f for f in facts if f.seq in doomed_seqs),
                ),
            )
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
