"""The run's effect journal as its writer holds it: opened on first use, and only once.

One journal per run: a second one would append with its own offsets and signature
chain, and skip the directory fsync that the first one (which created
``effects.log``) may not have made yet. A run that has no ``effects.log`` is at
position 0 without opening anything (only the writer's own journal creates one).

Example:
    >>> from pathlib import Path
    >>> from afk_local.storage.format.codec import RecordCodec
    >>> journal = WriterJournal(Path("/nowhere/effects.log"), "r", record_codec=RecordCodec())
    >>> journal.records()
    0
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

from afk_local.storage.format.codec import RecordCodec
from afk_local.storage.fsio import DEFAULT_ENV, Env
from afk_local.storage.rundir.effects import EffectLog, open_effect_log
from afk_local.storage.rundir.mirror import RunMirror


def _nothing() -> None:
    pass


def _no_close_hooks(hook: Callable[[], None]) -> None:
    pass


class WriterJournal:
    """Opens a run's journal once, on first use, for every thread of its writer.

    Args:
        path: the run's ``effects.log``.
        run_id: the run.
        record_codec: the store's codec (its key signs the records).
        listener: the run's remote mirror, told of every durable record.
        on_durable: told of the journal's end after each durable record (a head record).
        check_writable: raises when the writer may not write (called before opening).
        on_close: registers the journal's close with the writer's.
    """

    def __init__(
        self,
        path: Path,
        run_id: str,
        *,
        record_codec: RecordCodec,
        listener: RunMirror | None = None,
        on_durable: Callable[[int, bytes], None] | None = None,
        env: Env = DEFAULT_ENV,
        check_writable: Callable[[], None] = _nothing,
        on_close: Callable[[Callable[[], None]], None] = _no_close_hooks,
    ) -> None:
        self.path = path
        self.run_id = run_id
        self._codec = record_codec
        self._listener = listener
        self._on_durable = on_durable
        self._env = env
        self._check_writable = check_writable
        self._on_close = on_close
        self.log: EffectLog | None = None
        """The journal once opened (None before its first use)."""
        self._lock = threading.Lock()
        self._absent = False  # no effects.log yet (only our own journal creates one)

    def get(self) -> EffectLog:
        """The journal, opened now if it was not yet; threads that ask at once share it."""
        journal = self.log
        if journal is None:
            with self._lock:
                journal = self.log
                if journal is None:
                    self._check_writable()
                    journal = open_effect_log(
                        self.path,
                        self.run_id,
                        record_codec=self._codec,
                        listener=self._listener,
                        on_durable=self._on_durable,
                        env=self._env,
                    )
                    self._on_close(journal.close)
                    self.log = journal
                    self._absent = False
        return journal

    def records(self) -> int:
        """How many effect records are durable in the journal now (0 without a journal).

        An existing journal that was not opened yet is opened (and a torn tail repaired)
        to count.
        """
        if self.log is None:
            if self._absent or not os.path.lexists(self.path):
                self._absent = True
                return 0
            return len(self.get())
        return len(self.log)

    @property
    def failed(self) -> BaseException | None:
        """The write or fsync error that made the journal refuse appends, if any."""
        return None if self.log is None else self.log.failed

    def close_inherited(self) -> None:
        """In a forked child: let go of the inherited descriptor (no lock, no fsync)."""
        if self.log is not None:
            self.log.close()


__all__ = ["WriterJournal"]
