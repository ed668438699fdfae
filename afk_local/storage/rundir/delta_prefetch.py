"""Preparing the next delta's compressor while the disk syncs.

A delta is compressed with its base (the previous checkpoint of the same phase) as
a zstd dictionary, and loading a dictionary means indexing every byte of it: for a
10 KB state that is most of a checkpoint's CPU work (~40% of its instructions,
measured with callgrind), done on the caller's critical path for every ``sync``
checkpoint. The checkpoint just written *is* the next delta's base, though, and the
writer then waits for two fsyncs with the GIL released. :class:`DeltaPrefetch`
hands the base to one background thread that builds and warms a compressor for it
during that wait: :meth:`~DeltaPrefetch.submit` only notes the base, and the writer
calls :meth:`~DeltaPrefetch.start` right before the file's fsync. (Waking the
thread any earlier made it compete with the encoding and the writes for the GIL:
a sync checkpoint then cost ~50 µs more than with no prefetch at all, on a disk
whose fsync takes ~300 µs.) The next delta of that phase picks it up if it is ready, built
for exactly that base and the parameters the delta needs, and otherwise compresses
the usual way. Nothing waits for the thread and nothing it does touches the disk:
it changes how fast a delta is made, never what is published (a frame that decodes to
the same record, against the same base) or when.

Handing work to a thread only pays when the disk's wait can hide it. On a fast disk
(tmpfs, a quick NVMe) the fsyncs return in microseconds, and waking the thread, the
GIL passing back and forth and the warm-up compress cost more than the delta they
spare (measured on tmpfs: ~60 µs more per checkpoint with the thread than without).
So :meth:`~DeltaPrefetch.start` times the wait it overlaps (until the writer calls
:meth:`~DeltaPrefetch.synced`) and the worker times each preparation; a base is handed
over only while the waits are at least twice as long as the last preparation, and is
otherwise compressed on the caller's path, as without a prefetch.

Example:
    >>> prefetch = DeltaPrefetch(level=3)
    >>> base = b"state " * 2000
    >>> prefetch.submit("runtime_state", base)
    >>> prefetch.start()  # the writer calls this as its fsync begins
    >>> frame = prefetch.compress("runtime_state", base, base + b"one more line")
    >>> len(frame) < 100
    True
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import deque

import zstandard

from afk_local.storage.format import codec

log = logging.getLogger("afk_local")

MAX_PREFETCH_BASE_BYTES = 4 << 20
"""Bases above this are not prepared ahead: their match tables cost megabytes each,
and compressing such a state costs far more than loading its base anyway."""


WAITS_KEPT = 8
"""Recent waits for the disk whose shortest decides whether to prepare in the background."""


class _Slot:
    """The prepared compressor of one phase: what was asked for, and what is ready."""

    __slots__ = ("base", "prepared_ns", "ready", "wanted")

    def __init__(self) -> None:
        self.base = b""
        """The base submitted last."""
        self.wanted: tuple[bytes, zstandard.ZstdCompressionParameters] | None = None
        self.ready: tuple[bytes, zstandard.ZstdCompressor] | None = None
        self.prepared_ns = 0
        """How long the worker took to prepare ``ready``."""


class _Worker:
    """The one background thread of a process that builds prepared compressors."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[_Slot] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="afk-delta-prefetch", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            slot = self.jobs.get()
            wanted = slot.wanted
            if wanted is None or (slot.ready is not None and slot.ready[0] is wanted[0]):
                continue  # superseded, or already prepared
            base, params = wanted
            started = time.perf_counter_ns()
            try:
                dictionary = zstandard.ZstdCompressionDict(
                    base, dict_type=zstandard.DICT_TYPE_RAWCONTENT
                )
                compressor = zstandard.ZstdCompressor(
                    dict_data=dictionary, compression_params=params
                )
                # Compressing once builds the dictionary's match tables and sizes the
                # context for a record like the base, with the GIL released.
                compressor.compress(base)
            except (zstandard.ZstdError, MemoryError) as exc:  # pragma: no cover - defensive
                log.debug("delta prefetch skipped: %s", exc)
                continue
            if slot.wanted is wanted:
                slot.prepared_ns = time.perf_counter_ns() - started
                slot.ready = (base, compressor)


class _Process:
    """This process's worker, started on first use (a forked child starts its own)."""

    worker: _Worker | None = None
    lock = threading.Lock()

    @classmethod
    def jobs(cls) -> queue.SimpleQueue[_Slot]:
        worker = cls.worker
        if worker is None:
            with cls.lock:
                worker = cls.worker
                if worker is None:
                    worker = cls.worker = _Worker()
        return worker.jobs

    @classmethod
    def forget(cls) -> None:
        # In a forked child the worker thread and any holder of the lock are gone.
        cls.worker = None
        cls.lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_Process.forget)


class DeltaPrefetch:
    """Prepared delta compressors of one writer, one per phase.

    Not thread-safe: the writer calls it under its own serialisation.

    Args:
        level: the zstd level deltas are compressed at.
        overlap: True hands every base to the thread, False none; None (default)
            decides at each :meth:`start` from the last wait and the last preparation.
    """

    def __init__(self, level: int = codec.DEFAULT_LEVEL, *, overlap: bool | None = None) -> None:
        self.level = level
        self.overlap = overlap
        self._slots: dict[str, _Slot] = {}
        self._queued: list[_Slot] = []
        self._wait_started = 0
        self._waits: deque[int] = deque(maxlen=WAITS_KEPT)
        self.wait_ns = 0
        """How long a wait for the disk takes (from :meth:`start` to :meth:`synced`):
        the shortest of the last :data:`WAITS_KEPT`."""
        self.prepared_ns = 0
        """How long the thread took to prepare the last compressor that was used."""
        self.hits = 0
        """Deltas compressed with a prepared compressor."""
        self.misses = 0
        """Deltas compressed the usual way (nothing prepared, not ready yet, or another base)."""

    def submit(self, phase: str, base: bytes) -> None:
        """Note ``base`` as the base of ``phase``'s next delta; :meth:`start` has the
        thread prepare its compressor."""
        if len(base) > MAX_PREFETCH_BASE_BYTES:
            self._slots.pop(phase, None)
            return
        slot = self._slots.get(phase)
        if slot is None:
            slot = self._slots[phase] = _Slot()
        slot.base = base
        slot.wanted = slot.ready = None  # what to prepare is worked out if the thread gets it
        self._queued.append(slot)

    def start(self) -> None:
        """Hand the bases submitted since the last call to the background thread, when
        the disk's waits are long enough to hide their preparation; the writer calls it
        as the wait for the disk begins."""
        if self._queued:
            if self.worth_overlapping():
                jobs = _Process.jobs()
                for slot in self._queued:
                    base = slot.base
                    slot.wanted = (base, codec.delta_parameters(self.level, len(base), len(base)))
                    jobs.put(slot)
            self._queued.clear()
        self._wait_started = time.perf_counter_ns()

    def synced(self) -> None:
        """The wait that began at :meth:`start` is over (the checkpoint is durable)."""
        if self._wait_started:
            self._waits.append(time.perf_counter_ns() - self._wait_started)
            # The shortest of the recent waits: a busy machine only ever stretches a wait
            # (a preempted fsync), so one long wait must not make the disk look slow.
            self.wait_ns = min(self._waits)
            self._wait_started = 0

    def worth_overlapping(self) -> bool:
        """Whether the next bases go to the thread: with ``overlap`` None, while the
        waits for the disk are at least twice as long as the last preparation took
        (the margin pays for waking the thread and passing the GIL back and forth)."""
        if self.overlap is not None:
            return self.overlap
        return self.wait_ns >= 2 * self.prepared_ns

    def forget(self, phase: str) -> None:
        """Drop what was prepared for ``phase`` (its next checkpoint is a keyframe)."""
        self._slots.pop(phase, None)

    def compress(self, phase: str, base: bytes, raw: bytes) -> bytes:
        """The delta frame of ``raw`` against ``base``: with the prepared compressor when it
        is ready and made for this base and these parameters, else the usual way."""
        slot = self._slots.pop(phase, None)
        ready = None if slot is None else slot.ready
        if ready is not None and ready[0] is base:
            params = codec.delta_parameters(self.level, len(base), len(raw))
            wanted = slot.wanted if slot is not None else None
            if wanted is not None and wanted[1] is params and slot is not None:
                self.hits += 1
                self.prepared_ns = slot.prepared_ns
                return ready[1].compress(raw)
        self.misses += 1
        return codec.compress(raw, base, level=self.level)


__all__ = ["MAX_PREFETCH_BASE_BYTES", "WAITS_KEPT", "DeltaPrefetch"]
