"""Durability modes on top of a :class:`~afk_local.storage.rundir.write.writer.RunWriter`
(docs/runner.md).

``sync``
    :meth:`DurableWriter.checkpoint` returns once the checkpoint is on stable
    storage (two fsyncs).
``async``
    :meth:`DurableWriter.checkpoint` snapshots the payload (encodes it) and
    enqueues it; one background thread writes the queue in order, replacing
    consecutive queued ``runtime_state`` checkpoints by the newest. A crash
    loses at most the queued checkpoints.
``exit``
    Checkpoints are kept in memory (encoded, coalesced the same way) and written
    at pause, terminal, error, :meth:`DurableWriter.close` and interpreter exit.

In every mode the effect journal (:attr:`DurableWriter.effects`) is written
synchronously, and pause/terminal writes first flush what is queued, then
write synchronously. A failed write (an fsync error above all) is fatal: the
writer never retries it, and the error reaches the job at its next call.

A writer belongs to the process that opened it. A child made by ``os.fork()``
inherits the object, its queue and its atexit hook, but not the background thread
nor the right to write: every write there raises
:class:`~afk_local.errors.ForkedWriterError`, and its exit and ``close()`` write
nothing and wait for nothing.

Example:
    >>> import afk_local as afk
    >>> from afk_local.runner.writer import DurableWriter
    >>> store = afk.Store("/tmp/afk-doc-writer")
    >>> writer = DurableWriter(store.create(), durability="async")
    >>> for i in range(3):
    ...     writer.checkpoint("runtime_state", {"i": i}, step=i)
    >>> _ = writer.finish("done")
    >>> writer.close()
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import msgspec

from afk_local.errors import (
    FlushTimeoutError,
    ForkedWriterError,
    UnstorableValueError,
    WriterFailedError,
)
from afk_local.journal.journal import journal_of
from afk_local.storage.format.layout import validate_phase
from afk_local.storage.format.records import Checkpoint, ErrorInfo, Phase
from afk_local.storage.rundir.read.metrics import METRICS_KEY, Batch, add_batch, merge_batches
from afk_local.storage.rundir.write.writer import RunWriter

if TYPE_CHECKING:
    from afk_local.journal.journal import Journal

log = logging.getLogger("afk_local")

Durability = Literal["sync", "async", "exit"]
DURABILITY_MODES: tuple[str, ...] = ("sync", "async", "exit")
DEFAULT_MAX_QUEUE = 1024
"""Queued checkpoints at which ``async`` :meth:`DurableWriter.checkpoint` waits (backpressure)."""

_RUNTIME_STATE = Phase.RUNTIME_STATE.value


class _Pending(NamedTuple):
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


def validate_durability(durability: str) -> str:
    """Return ``durability`` if it is one of ``sync``, ``async``, ``exit``; else ValueError."""
    if durability not in DURABILITY_MODES:
        raise ValueError(
            f"durability must be one of {', '.join(DURABILITY_MODES)}, not {durability!r}"
        )
    return durability


class DurableWriter:
    """A run writer with a durability mode; the one object a runner writes through.

    Args:
        run: the run's :class:`~afk_local.storage.rundir.write.writer.RunWriter` (this object owns
            it from now on and closes it in :meth:`close`).
        durability: ``"sync"``, ``"async"`` or ``"exit"`` (see the module docstring).
        flush_timeout_s: how long :meth:`flush` (and so every pause/terminal write)
            waits for the queue before raising :class:`FlushTimeoutError`.
        coalesce_runtime_state: replace consecutive queued ``runtime_state``
            checkpoints by the newest one (``async`` and ``exit``).
        max_queue: ``async`` only: queued checkpoints after which
            :meth:`checkpoint` blocks until the background writer catches up.
    """

    def __init__(
        self,
        run: RunWriter,
        durability: Durability = "sync",
        *,
        flush_timeout_s: float = 30.0,
        coalesce_runtime_state: bool = True,
        max_queue: int = DEFAULT_MAX_QUEUE,
    ) -> None:
        self.run = run
        self.durability: str = validate_durability(durability)
        if flush_timeout_s <= 0:
            raise ValueError("flush_timeout_s must be positive")
        self.flush_timeout_s = flush_timeout_s
        self.coalesce_runtime_state = coalesce_runtime_state
        self._max_queue = max(1, max_queue)
        self._pid = os.getpid()
        # Encode with the run's own hooks so custom payload types behave as in sync mode.
        self._encode = run.record_codec.encode
        self._max_record_bytes = run.max_record_bytes
        self._cond = threading.Condition()
        self._io_lock = threading.RLock()  # serialises every call into the RunWriter
        self._queue: deque[_Pending] = deque()
        self._busy = False
        self._stopping = False
        self._error: BaseException | None = None
        self._error_surfaced = False
        self._closed = False
        self._last_step: int | None = None
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
        if self.durability != "sync":
            atexit.register(self._at_exit)

    def __repr__(self) -> str:
        return (
            f"DurableWriter(run_id={self.run.run_id!r}, durability={self.durability!r}, "
            f"pending={self.pending})"
        )

    # -- properties ---------------------------------------------------------------

    @property
    def run_id(self) -> str:
        """The run being written."""
        return self.run.run_id

    @property
    def effects(self) -> Journal:
        """The run's effect journal; synchronous in every durability mode."""
        return journal_of(self.run)

    @property
    def pending(self) -> int:
        """Checkpoints accepted but not yet on disk (queued or being written)."""
        with self._cond:
            return len(self._queue) + (1 if self._busy else 0)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._closed

    @property
    def failed(self) -> BaseException | None:
        """The error that made this writer refuse further writes, if any."""
        return self._error

    # -- checkpoints --------------------------------------------------------------

    def checkpoint(
        self, phase: str | Phase, payload: Any, *, step: int, metrics: Batch | None = None
    ) -> None:
        """Persist a checkpoint according to the durability mode.

        ``sync``: durable on return. ``async``: snapshotted and queued.
        ``exit``: snapshotted and kept in memory. The payload is encoded here in
        every mode, so later changes to it are not seen and a payload that
        cannot be stored raises here, in the caller. ``metrics`` (a dict payload
        only) are written as its ``metrics`` entry; a queued checkpoint replaced by
        a newer one hands its metrics on to it.

        Raises:
            WriterFailedError: an earlier write failed (the first time, the
                original error itself is raised).
        """
        self._check_usable()
        phase_name = validate_phase(phase)
        if metrics and not isinstance(payload, dict):
            raise ValueError("a checkpoint that carries metrics needs a dict payload")
        self._last_step = step
        if self.durability == "sync":
            if metrics:  # plain numbers: encoded here in C, not walked for typed values
                payload = {**payload, METRICS_KEY: msgspec.Raw(msgspec.msgpack.encode(metrics))}
            with self._io_lock:
                try:
                    self.run.checkpoint(phase_name, payload, step=step)
                except BaseException as exc:
                    if self.run.failed is not None:  # I/O failed: fatal, as in the other modes
                        self._set_error(exc)
                        self._error_surfaced = True
                    raise
                self.written += 1
            return
        try:
            data = self._encode(payload)
        except UnstorableValueError as exc:
            raise exc.under("", self.run_id) from None
        if len(data) > self._max_record_bytes:
            raise ValueError(
                f"run {self.run_id!r}: checkpoint payload of {len(data)} bytes exceeds "
                f"max_record_bytes={self._max_record_bytes}"
            )
        item = _Pending(
            phase_name, msgspec.Raw(data), step, self.run.journal_records(), metrics or None
        )
        with self._cond:
            if self.durability == "async":
                while len(self._queue) >= self._max_queue and self._error is None:
                    self._cond.wait(0.1)
            self._raise_error_locked()
            if (
                self.coalesce_runtime_state
                and phase_name == _RUNTIME_STATE
                and self._queue
                and self._queue[-1].phase == _RUNTIME_STATE
            ):
                replaced = self._queue[-1]
                self._queue[-1] = item._replace(metrics=merge_batches(replaced.metrics, metrics))
                self.coalesced += 1
            else:
                self._queue.append(item)
            self._cond.notify_all()

    def flush(self) -> None:
        """Write everything queued, in order; return when it is durable (and mirrored).

        With a remote mirror (``Store(mirror=...)``) this also waits until the mirror
        has uploaded everything written so far.

        Raises:
            FlushTimeoutError: the queue was not written within ``flush_timeout_s``.
            WriterFailedError: the background writer failed (first time: its own error).
            ForkedWriterError: called in a forked child of the process that opened the run.
            MirrorError: the mirror failed or did not catch up within ``flush_timeout_s``.
            LeaseLostError: another store took the run (``pull --take``).
        """
        self._flush_local()
        self.run.flush_mirror(self.flush_timeout_s)

    def _flush_local(self) -> None:
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

    # -- terminal and pause writes (always synchronous, after a flush) ---------------

    def finish(self, result: Any = None, **extra: Any) -> Checkpoint:
        """Flush, then durably write the ``run_terminal`` checkpoint of a completed run."""
        self._flush_local()
        with self._io_lock:
            return self.run.finish(result, **self._with_step(extra))

    def fail(self, error: BaseException | ErrorInfo | str, **extra: Any) -> Checkpoint:
        """Flush, then durably mark the run failed with ``error``."""
        self._flush_local()
        with self._io_lock:
            return self.run.fail(error, **self._with_step(extra))

    def pause(self, kind: str = "input", prompt: Any = None, **extra: Any) -> Checkpoint:
        """Flush, then durably write the ``paused`` checkpoint and mark the run paused."""
        self._flush_local()
        with self._io_lock:
            return self.run.pause(kind, prompt, **self._with_step(extra))

    def cancel(self, reason: str = "cancelled") -> Checkpoint:
        """Flush, then durably make the run terminal with state ``cancelled``."""
        self._flush_local()
        with self._io_lock:
            return self.run.cancel(reason, **self._with_step({}))

    def update_meta(self, **changes: Any) -> None:
        """Replace ``run.meta`` with ``changes`` applied (synchronous, ordered with writes)."""
        self._check_usable()
        with self._io_lock:
            self.run.update_meta(**changes)

    def _with_step(self, extra: dict[str, Any]) -> dict[str, Any]:
        if "step" not in extra and self._last_step is not None:
            return {**extra, "step": self._last_step}
        return extra

    # -- lifetime -----------------------------------------------------------------

    def close(self) -> None:
        """Flush what is queued, stop the background thread and release the run's lock.

        Idempotent. An error that was already raised to the caller is not raised again.
        In a forked child it writes nothing and waits for nothing (the queue and the
        lock are the parent's).
        """
        if self._closed:
            return
        if os.getpid() != self._pid:
            self._closed = True
            self.run.close()  # lets go of inherited descriptors only
            return
        try:
            if self._error is None:
                self._flush_local()  # the run's close then waits for its mirror
        finally:
            self._closed = True
            with self._cond:
                self._stopping = True
                self._queue.clear()
                self._cond.notify_all()
            if self._thread is not None and self._thread is not threading.current_thread():
                self._thread.join(self.flush_timeout_s)
            if self.durability != "sync":
                atexit.unregister(self._at_exit)
            self.run.close()

    def __enter__(self) -> DurableWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _at_exit(self) -> None:
        # Interpreter exit without close(): persist what is queued; the lock goes with the process.
        # Not in a forked child: the queue is the parent's (and written by the parent),
        # the background thread did not survive the fork, and its locks may be held.
        if self._closed or self._error is not None or os.getpid() != self._pid:
            return
        try:
            self._flush_local()
        except BaseException:
            log.exception("run %s: could not write queued checkpoints at exit", self.run_id)

    # -- background writer --------------------------------------------------------

    def _write_behind(self) -> None:
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
