"""A writer's lifetime: whether it may write, the writes in flight, and closing.

A writer may write in the process that opened it, until it is closed, and as long as
nothing it wrote failed: an I/O error is fatal (docs/guarantees.md, 5: the run on disk
is the truth then, and only a reopen reads it), and so is a journal that lost a record
or a mirror whose lease another store took. The run's lock outlives every write
(docs/guarantees.md, 7): ``close()`` while another thread is inside a write (an async
writer's thread stuck on a slow disk) leaves the release to that write's end, or a
new owner could take the run while this one still renames. A forked child inherits
the writer object, never the right to write.

Example:
    >>> life = WriterLifetime("r", release=lambda: None)
    >>> with life:  # one write
    ...     pass
    >>> life.close(inherited=lambda: None)
    >>> life.closed
    True
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

from afk_local.errors import ForkedWriterError, WriterFailedError
from afk_local.storage.rundir.mirror import RunMirror
from afk_local.storage.rundir.write.writer_journal import WriterJournal

log = logging.getLogger("afk_local")


class WriterLifetime:
    """Says whether a writer may write, counts its writes in and out, and closes it.

    Used as a ``with`` block around each write: refused once closed (and in a forked
    child), and a close meanwhile waits for its end to release the lock. One reusable
    object per writer: cheaper than a generator-based context manager, which every sync
    checkpoint would build and tear down.

    Args:
        run_id: the run (for errors and logs).
        release: lets go of the run's lock (and what the writer held open with it).
        mirror: the run's remote mirror (a lost lease stops the writer).
    """

    __slots__ = (
        "_guard",
        "_hooks",
        "_in_flight",
        "_mirror",
        "_release",
        "_release_pending",
        "closed",
        "failed",
        "journal",
        "pid",
        "run_id",
    )

    def __init__(
        self,
        run_id: str,
        *,
        release: Callable[[], None],
        mirror: RunMirror | None = None,
    ) -> None:
        self.run_id = run_id
        self.pid = os.getpid()
        """The process that opened the writer: the only one that may write."""
        self.closed = False
        """True once :meth:`close` began: no write starts any more."""
        self.failed: BaseException | None = None
        """The I/O error that made the writer refuse further writes, if any."""
        self.journal: WriterJournal | None = None
        """The writer's journal, once made: a journal that failed stops the writer."""
        self._mirror = mirror
        self._release = release
        self._guard = threading.Lock()
        self._in_flight = 0
        self._release_pending = False
        self._hooks: list[Callable[[], None]] = []

    def check_process(self) -> None:
        """Raise ForkedWriterError in any process but the one that opened the writer."""
        if os.getpid() != self.pid:
            raise ForkedWriterError(self.run_id, self.pid, os.getpid())

    def check_writable(self) -> None:
        """Raise when the writer may not write: ForkedWriterError in another process,
        WriterFailedError once closed or failed (or its journal failed), LeaseLostError
        once another store took the run's mirror lease."""
        self.check_process()
        self._check_open()

    def _check_open(self) -> None:
        """:meth:`check_writable` but for the process (which the caller checked)."""
        if self.closed:
            raise WriterFailedError(self.run_id, RuntimeError("writer is closed"))
        if self.failed is not None:
            raise WriterFailedError(self.run_id, self.failed)
        journal = None if self.journal is None else self.journal.log
        if journal is not None and journal.failed is not None:
            # The journal lost a record it could not make durable: the run on disk is
            # the truth now, and only a reopen reads it.
            raise WriterFailedError(self.run_id, journal.failed)
        if self._mirror is not None:
            self._mirror.check()  # LeaseLostError once another store took the run

    def fail(self, exc: BaseException) -> None:
        """Record the error that kills the writer: every later write refuses."""
        self.failed = exc

    def __enter__(self) -> None:
        self.check_process()  # before any lock: one a parent's thread held at fork stays held
        with self._guard:
            self._check_open()
            self._in_flight += 1

    def __exit__(self, *exc_info: object) -> None:
        with self._guard:
            self._in_flight -= 1
            release = self._release_pending and self._in_flight == 0
            if release:
                self._release_pending = False
        if release:
            self._release()
            log.info("run %s: lock released after the last write of a closed writer", self.run_id)

    def on_close(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` when the writer closes, before the lock is released (the hooks run
        last registered first)."""
        self._hooks.append(hook)

    def close(self, inherited: Callable[[], None]) -> None:
        """Close: run the hooks, then release the lock, now or after the last write. Idempotent.

        In a forked child only ``inherited`` is called (letting go of inherited
        descriptors): the lock stays the parent's.
        """
        if os.getpid() != self.pid:
            self.closed = True
            inherited()
            return
        with self._guard:
            if self.closed:
                return
            self.closed = True  # from here on no write starts
        try:
            for hook in reversed(self._hooks):
                hook()
        finally:
            with self._guard:
                release = self._in_flight == 0
                self._release_pending = not release
            if release:
                self._release()
            else:
                log.warning(
                    "run %s: closed while a write is in progress; the lock stays held until it "
                    "ends",
                    self.run_id,
                )


__all__ = ["WriterLifetime"]
