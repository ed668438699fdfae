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
import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

import msgspec

from afk_local.errors import AfkLocalError, RunExistsError
from afk_local.integrations.langgraph.index import (
    INDEX_NAME,
    PHASE,
    IndexEntry,
    Payload,
    append_to_index_file,
    record_deletions,
)
from afk_local.integrations.langgraph.thread_reads import (
    INTEGRATION,
    RUN_PREFIX,
    ThreadHandle,
    ThreadReads,
    thread_run_id,
)
from afk_local.integrations.langgraph.writes import (
    WRITES_NAME,
    append_writes,
    mark_after,
    open_writes,
    rewrite_writes,
    state_mark,
)
from afk_local.storage import fsio
from afk_local.storage.format.layout import (
    CheckpointFile,
)
from afk_local.storage.format.records import LANGGRAPH_IDLE_PAUSE_KIND, PauseInfo, RunStatus

# The writer (filelock, the journal, packing) and retention are imported where a thread
# is first written or pruned: a process that only reads its threads never loads them.
if TYPE_CHECKING:
    from afk_local.storage.rundir.write.writer import RunWriter

log = logging.getLogger("afk_local")


class ThreadFiles(ThreadReads):
    """The LangGraph threads of one store, as run directories.

    Not thread-safe: the saver calls it under one lock.

    Args:
        store: the store holding the threads.
        lock_timeout: seconds to wait for a thread's ``owner.lock`` held by
            another process before :class:`afk_local.RunLockedError`.
        max_open_threads: threads kept open (lock and descriptors held) at once;
            the least recently used are closed beyond this.
    """

    def close(self) -> None:
        """Close every open thread: mark it idle (``paused``) and release its lock."""
        while self._handles:
            _, handle = self._handles.popitem(last=False)
            self._close_handle(handle, idle=True)

    # -- reading --------------------------------------------------------------------

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
                            kind=LANGGRAPH_IDLE_PAUSE_KIND,
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
        links of survivors go into ``run.meta`` first, and the run's head record is
        narrowed durably (it names the newest checkpoint, which may go); the index cache
        gets a durable tombstone per doomed name (a later checkpoint may reuse it); then
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
            handle.writer.loosen_head()  # a crash from here on: the head behind, not ahead
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
