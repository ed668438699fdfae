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
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from afk_local.errors import (
    FlushTimeoutError,
    ForkedWriterError,
    UnstorableValueError,
    WriterFailedError,
)
from afk_local.journal.journal import journal_of
from afk_local.runner.write_queue import CheckpointQueue, QueuedCheckpoint
from afk_local.storage.format.layout import validate_phase
from afk_local.storage.format.records import Checkpoint, ErrorInfo, Phase
from afk_local.storage.rundir.read.metrics import METRICS_KEY, Batch
from afk_local.storage.rundir.write.writer import RunWriter

if TYPE_CHECKING:
    from afk_local.journal.journal import Journal

log = logging.getLogger("afk_local")

Durability = Literal["sync", "async", "exit"]
DURABILITY_MODES: tuple[str, ...] = ("sync", "async", "exit")
DEFAULT_MAX_QUEUE = 1024
"""Queued checkpoints at which ``async`` :meth:`DurableWriter.checkpoint` waits (backpressure)."""

__all__ = [
    "DEFAULT_MAX_QUEUE",
    "DURABILITY_MODES",
    "CheckpointQueue",
    "Durability",
    "DurableWriter",
    "FlushTimeoutError",
    "ForkedWriterError",
    "WriterFailedError",
    "validate_durability",
]


def validate_durability(durability: str) -> str:
    """Return ``durability`` if it is one of ``sync``, ``async``, ``exit``; else ValueError."""
    if durability not in DURABILITY_MODES:
        raise ValueError(
            f"durability must be one of {', '.join(DURABILITY_MODES)}, not {durability!r}"
        )
    return durability


class DurableWriter(CheckpointQueue):
    """A run writer with a durability mode; the one object a runner writes through.

    Its queue (``async`` and ``exit``) is the base class's,
    :class:`~afk_local.runner.write_queue.CheckpointQueue`; this class holds the modes'
    policy: what each mode does at a checkpoint, the flush before a pause or terminal
    write, closing and interpreter exit.

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
        super().__init__(
            run,
            validate_durability(durability),
            flush_timeout_s=flush_timeout_s,
            coalesce_runtime_state=coalesce_runtime_state,
            max_queue=max_queue,
        )
        # Encode with the run's own hooks so custom payload types behave as in sync mode.
        self._encode = run.record_codec.encode
        self._max_record_bytes = run.max_record_bytes
        self._last_step: int | None = None
        if self.durability != "sync":
            atexit.register(self._at_exit)

    def __repr__(self) -> str:
        return (
            f"DurableWriter(run_id={self.run.run_id!r}, durability={self.durability!r}, "
            f"pending={self.pending})"
        )

    # -- properties ---------------------------------------------------------------

    @property
    def effects(self) -> Journal:
        """The run's effect journal; synchronous in every durability mode."""
        return journal_of(self.run)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._closed

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
        item = QueuedCheckpoint(
            phase_name, msgspec.Raw(data), step, self.run.journal_records(), metrics or None
        )
        self._enqueue(item)

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
            self._stop()
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
