"""The queue of the ``async`` and ``exit`` write modes (:mod:`afk_local.runner.writer`).

A :class:`CheckpointQueue` holds checkpoints that were accepted (encoded) but are not
on disk yet, in order, and writes them through the run's
:class:`~afk_local.storage.rundir.write.writer.RunWriter`: a background thread does it
in ``async`` mode (the caller waits only when the queue is full), the caller itself
at a flush in ``exit`` mode. Consecutive queued ``runtime_state`` checkpoints are
replaced by the newest, its metrics merged. The first failed write is fatal: what is
queued is dropped, the error is raised once as itself and then as
:class:`~afk_local.errors.WriterFailedError`. A forked child may not write through a
queue its parent owns (:class:`~afk_local.errors.ForkedWriterError`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from typing import NamedTuple

import msgspec

from afk_local.errors import FlushTimeoutError, ForkedWriterError, WriterFailedError
from afk_local.storage.format.records import Phase
from afk_local.storage.rundir.read.metrics import Batch, add_batch, merge_batches
from afk_local.storage.rundir.write.writer import RunWriter

log = logging.getLogger("afk_local")

_RUNTIME_STATE = Phase.RUNTIME_STATE.value


class QueuedCheckpoint(NamedTuple):
    """A checkpoint accepted and encoded, waiting in the queue to be written."""

    phase: str
    payload: msgspec.Raw
    step: int
    journal_records: int
    """The journal position when the state was snapshotted, not when it is written."""
    metrics: Batch | None = None
    """Kept apart from the encoded payload, so a coalesced checkpoint hands its points on."""

    def record_payload(self) -> msgspec.Raw:
        """The payload as written: with its metrics entry, when it has one."""
        if not self.metrics:
            return self.payload
        return msgspec.Raw(add_batch(bytes(self.payload), self.metrics))


class CheckpointQueue:
    """Checkpoints accepted but not on disk yet, and who writes them: the base of
    :class:`~afk_local.runner.writer.DurableWriter`, which adds the modes' policy.

    Args:
        run: the run's writer every queued checkpoint is written through.
        durability: ``"async"`` starts the background thread; ``"exit"`` drains the
            queue in the caller at each flush; ``"sync"`` queues nothing.
        flush_timeout_s: how long a flush waits for the background thread.
        coalesce_runtime_state: replace consecutive queued ``runtime_state``
            checkpoints by the newest one.
        max_queue: ``async`` only: queued checkpoints after which :meth:`_enqueue`
            blocks until the background writer catches up.
    """

    def __init__(
        self,
        run: RunWriter,
        durability: str,
        *,
        flush_timeout_s: float,
        coalesce_runtime_state: bool,
        max_queue: int,
    ) -> None:
        self.run = run
        self.durability = durability
        if flush_timeout_s <= 0:
            raise ValueError("flush_timeout_s must be positive")
        self.flush_timeout_s = flush_timeout_s
        self.coalesce_runtime_state = coalesce_runtime_state
        self._max_queue = max(1, max_queue)
        self._pid = os.getpid()
        self._cond = threading.Condition()
        self._io_lock = threading.RLock()  # serialises every call into the RunWriter
        self._queue: deque[QueuedCheckpoint] = deque()
        self._busy = False
        self._stopping = False
        self._error: BaseException | None = None
        self._error_surfaced = False
        self._closed = False
        self.written = 0
        """Checkpoints written to disk through this writer."""
        self.coalesced = 0
        """Queued checkpoints replaced by a newer one before they were written."""
        self._thread: threading.Thread | None = None
        if self.durability == "async":
            self._thread = threading.Thread(
                target=self._write_behind, name=f"afk-writer-{run.run_id}", daemon=True
            )
            self._thread.start()

    # -- properties ---------------------------------------------------------------

    @property
    def run_id(self) -> str:
        """The run being written."""
        return self.run.run_id

    @property
    def pending(self) -> int:
        """Checkpoints accepted but not yet on disk (queued or being written)."""
        with self._cond:
            return len(self._queue) + (1 if self._busy else 0)

    @property
    def failed(self) -> BaseException | None:
        """The error that made this writer refuse further writes, if any."""
        return self._error

    # -- the queue ----------------------------------------------------------------

    def _enqueue(self, item: QueuedCheckpoint) -> None:
        """Queue ``item`` after the checkpoints before it, or in place of the queued
        ``runtime_state`` it follows (``async``: wait while the queue is full)."""
        with self._cond:
            if self.durability == "async":
                while len(self._queue) >= self._max_queue and self._error is None:
                    self._cond.wait(0.1)
            self._raise_error_locked()
            if (
                self.coalesce_runtime_state
                and item.phase == _RUNTIME_STATE
                and self._queue
                and self._queue[-1].phase == _RUNTIME_STATE
            ):
                replaced = self._queue[-1]
                self._queue[-1] = item._replace(
                    metrics=merge_batches(replaced.metrics, item.metrics)
                )
                self.coalesced += 1
            else:
                self._queue.append(item)
            self._cond.notify_all()

    def _flush_local(self) -> None:
        """Return once every queued checkpoint is on disk (``exit``: written here)."""
        # Pause and terminal writes wait for the disk only: a slow or failed mirror must
        # not keep a finished run from being recorded as finished (close() raises it).
        if os.getpid() != self._pid:
            raise ForkedWriterError(self.run_id, self._pid, os.getpid())
        if self.durability == "exit":
            self._drain_here()
            return
        with self._cond:
            deadline = time.monotonic() + self.flush_timeout_s
            while (self._queue or self._busy) and self._error is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise FlushTimeoutError(
                        self.run_id, len(self._queue) + self._busy, self.flush_timeout_s
                    )
                self._cond.wait(remaining)
            self._raise_error_locked()

    def _drain_here(self) -> None:
        """``exit`` mode: write the queue in this thread, in order."""
        with self._io_lock:
            while True:
                with self._cond:
                    self._raise_error_locked()
                    if not self._queue:
                        return
                    item = self._queue.popleft()
                try:
                    self.run.checkpoint(
                        item.phase,
                        item.record_payload(),
                        step=item.step,
                        journal_records=item.journal_records,
                    )
                except BaseException as exc:
                    self._set_error(exc)
                    self._error_surfaced = True
                    raise
                self.written += 1

    # -- background writer --------------------------------------------------------

    def _write_behind(self) -> None:
        """``async`` mode's thread: write the queue in order until stopped or failed."""
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if not self._queue:
                    return
                item = self._queue.popleft()
                self._busy = True
                self._cond.notify_all()
            try:
                with self._io_lock:
                    self.run.checkpoint(
                        item.phase,
                        item.record_payload(),
                        step=item.step,
                        journal_records=item.journal_records,
                    )
            except BaseException as exc:
                log.error(
                    "run %s: background checkpoint write failed, writer stopped: %s",
                    self.run_id,
                    exc,
                )
                self._set_error(exc)
                return
            with self._cond:
                self._busy = False
                self.written += 1
                self._cond.notify_all()

    def _stop(self) -> None:
        """Drop what is queued and let the background thread end (waited for, unless
        this is that thread)."""
        with self._cond:
            self._stopping = True
            self._queue.clear()
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(self.flush_timeout_s)

    # -- errors -------------------------------------------------------------------

    def _set_error(self, exc: BaseException) -> None:
        with self._cond:
            if self._error is None:
                self._error = exc
            dropped = len(self._queue)
            self._queue.clear()
            self._busy = False
            self._cond.notify_all()
        if dropped:
            log.error("run %s: %d queued checkpoint(s) were not written", self.run_id, dropped)

    def _check_usable(self) -> None:
        if os.getpid() != self._pid:  # before any lock: one held at the fork stays held
            raise ForkedWriterError(self.run_id, self._pid, os.getpid())
        if self._closed:
            raise WriterFailedError(self.run_id, RuntimeError("writer is closed"))
        if self._error is not None:  # set once, under the lock: read unlocked, then surely
            with self._cond:
                self._raise_error_locked()

    def _raise_error_locked(self) -> None:
        error = self._error
        if error is None:
            return
        if not self._error_surfaced:
            self._error_surfaced = True
            raise error
        raise WriterFailedError(self.run_id, error) from error
