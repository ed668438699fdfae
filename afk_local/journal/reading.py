"""An open ``effects.log`` read back: the file opened, scanned once into an index, and its records.

The lowest part of a :class:`~afk_local.journal.journal.Journal`: opening, the torn-tail
repair, the in-memory index of each key's newest intent and outcome, and every read.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

from afk_local.journal.replay import (
    render_call,
)
from afk_local.storage import fsio
from afk_local.storage.format.codec import EncHook, RecordCodec
from afk_local.storage.format.frames import MAX_FRAME_BYTES
from afk_local.storage.format.integrity import MAC_SIZE, NO_MAC, Signer
from afk_local.storage.format.journal_format import (
    DEFAULT_MAX_FRAME_BYTES,
    EffectHead,
    FrameReader,
    RecordOrder,
    TornTail,
)
from afk_local.storage.format.records import Effect

log = logging.getLogger("afk_local")


class _Entry:
    """Index slot for one key: offsets, not records, so memory stays small."""

    __slots__ = ("attempts", "input_hash", "intent_at", "outcome_at", "status")

    def __init__(self) -> None:
        self.intent_at: tuple[int, int] | None = None  # (offset, length) of the newest intent
        self.outcome_at: tuple[int, int] | None = None  # its outcome, if any
        self.input_hash = ""
        self.status: str | None = None
        self.attempts = 0


class EffectState:
    """What the journal knows about one key. The records are read from disk on first use."""

    __slots__ = ("_entry", "_intent", "_journal", "_outcome", "key")

    def __init__(self, journal: JournalFile, key: str, entry: _Entry) -> None:
        self.key = key
        self._journal = journal
        self._entry = entry  # live: later records of the key show up here
        self._intent: tuple[tuple[int, int], Effect] | None = None
        self._outcome: tuple[tuple[int, int], Effect] | None = None

    @property
    def intent(self) -> Effect | None:
        """The newest intent record of the key (None for an outcome written without one)."""
        at = self._entry.intent_at
        if at is None:
            return None
        if self._intent is None or self._intent[0] != at:
            self._intent = (at, self._journal._read_record(*at))
        return self._intent[1]

    @property
    def outcome(self) -> Effect | None:
        """The outcome of the newest intent, or None while in doubt."""
        at = self._entry.outcome_at
        if at is None:
            return None
        if self._outcome is None or self._outcome[0] != at:
            self._outcome = (at, self._journal._read_record(*at))
        return self._outcome[1]

    @property
    def in_doubt(self) -> bool:
        """True when the call started (intent durable) but no outcome was recorded."""
        return self._entry.intent_at is not None and self._entry.outcome_at is None

    @property
    def status(self) -> str | None:
        """The outcome's status (``"ok"`` / ``"error"``) without reading it, or None."""
        return self._entry.status

    @property
    def input_hash(self) -> str:
        """The input hash of the newest intent (``""`` when there is none)."""
        return self._entry.input_hash

    @property
    def attempts(self) -> int:
        """How many intents were recorded for this key (retries included)."""
        return self._entry.attempts

    def __repr__(self) -> str:
        state = "in doubt" if self.in_doubt else (self.status or "no intent")
        return f"EffectState(key={self.key!r}, {state}, attempts={self.attempts})"


class AppendListener(Protocol):
    """Told about a writable journal's appends (a run's remote mirror satisfies it)."""

    def before_append(self) -> None:
        """Called before a record is appended; raising refuses the append."""

    def synced(self, end: int) -> None:
        """Called after an fsync: the file is durable up to byte ``end``. Must not block."""

    def appended(self, end: int) -> None:
        """Called in the appending thread once its record (ending at byte ``end``) is
        durable, outside the journal's lock: the one place a listener may wait, and
        raising here fails that append (a mirror that keeps effects remote-durable)."""


class JournalFile:
    """The open file and its index: what a :class:`~afk_local.journal.journal.Journal` knows."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        run_id: str,
        *,
        writable: bool,
        record_codec: RecordCodec | None = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        listener: AppendListener | None = None,
        on_durable: Callable[[int, bytes], None] | None = None,
        env: fsio.Env = fsio.DEFAULT_ENV,
    ) -> None:
        self.path = Path(path)
        self._env = env
        self._listener = listener
        self._on_durable = on_durable
        self._tail = b""  # the last bytes written (up to MAC_SIZE): what on_durable reports
        self.run_id = run_id
        self.writable = writable
        self._pid = os.getpid()  # appends belong to the process that opened it, never a fork
        self.torn_tail: TornTail | None = None
        self.replayed_count = 0
        """How many :meth:`call` invocations this instance replayed instead of executing."""
        self._codec = record_codec or RecordCodec()
        self._signer: Signer | None = self._codec.signer
        self._last_mac = NO_MAC  # the chain value the next signed record links to
        self.signed_count = 0
        """How many records carry a signature (checked only in a keyed store)."""
        self._hash_hook: EncHook = self._codec.hash_hook
        self._max_frame = min(max_frame_bytes, MAX_FRAME_BYTES)
        self._index: dict[str, _Entry] = {}
        self._count = 0
        self._cond = threading.Condition(threading.Lock())
        self._failed: BaseException | None = None
        self._closed = False
        self._syncing = False
        self._pending: list[tuple[int, int, EffectHead]] = []  # written, not yet fsynced
        self._in_flight: dict[str, int] = {}  # key -> the thread running its call
        self._order = RecordOrder(str(path), run_id)
        self._fd = self._open()
        self._frames = FrameReader(
            self._fd,
            self.path,
            run_id,
            self._max_frame,
            self._signer,
            ext_hook=self._codec.ext_hook,
        )
        try:
            self._end = self._load()
        except BaseException:
            os.close(self._fd)
            raise
        self._written_end = self._synced_end = self._end
        if self._fd >= 0 and self._end:
            start = max(self._end - MAC_SIZE, 0)
            self._tail = os.pread(self._fd, self._end - start, start)

    def _open(self) -> int:
        if not self.writable:
            try:
                return fsio.open_regular(self.path)
            except FileNotFoundError:
                return -1  # no journal yet: an empty view
        existed = self.path.exists()
        fd = self._env.open_append(self.path)
        if not existed:
            try:
                self._env.fsync_dir(self.path.parent)  # the new entry must survive a crash too
            except BaseException:
                os.close(fd)
                raise
        return fd

    def _load(self) -> int:
        if self._fd < 0:
            return 0
        scan = self._frames.scan(os.fstat(self._fd).st_size, self._apply)
        if self._frames.order is not None:
            self._order = self._frames.order
        self._last_mac = scan.last_mac
        self.signed_count = scan.signed_count
        torn = self.torn_tail = scan.torn_tail
        if torn is None:
            return scan.end
        if self.writable:
            self._env.truncate(self._fd, torn.offset, self.path)
        log.warning(
            "run %s: %s: torn tail %s: %d byte(s) at offset %d (%s)",
            self.run_id,
            self.path,
            "repaired (truncated)" if self.writable else "ignored",
            torn.dropped_bytes,
            torn.offset,
            torn.reason,
        )
        return torn.offset

    def _apply(self, offset: int, length: int, head: EffectHead) -> None:
        entry = self._index.get(head.key)
        if entry is None:
            entry = self._index[head.key] = _Entry()
        if head.kind == "intent":
            entry.intent_at = (offset, length)
            entry.outcome_at = None  # an outcome belongs to the intent before it
            entry.input_hash = head.input_hash
            entry.status = None
            entry.attempts += 1
        else:
            entry.outcome_at = (offset, length)
            entry.status = head.status
        self._count += 1

    def _read_record(self, offset: int, length: int) -> Effect:
        # ``length``: the frame's size after its header (msgpack bytes and any MAC).
        if self._closed:
            raise ValueError(f"journal {self.path} is closed")
        return self._frames.read_record(offset, length)

    def lookup(self, key: str) -> EffectState | None:
        """What is known about ``key`` (None when nothing was recorded). O(1)."""
        entry = self._index.get(key)
        return None if entry is None else EffectState(self, key, entry)

    def keys(self) -> list[str]:
        """Every key with a record, in the order first recorded."""
        return list(self._index)

    def __len__(self) -> int:
        """The number of durable records (intents and outcomes)."""
        return self._count

    def in_doubt(self) -> list[EffectState]:
        """Every key whose newest intent has no outcome (the call may or may not have run)."""
        return [
            EffectState(self, key, entry)
            for key, entry in self._index.items()
            if entry.intent_at is not None and entry.outcome_at is None
        ]

    def records(self) -> Iterator[Effect]:
        """Every durable record in file order, read lazily from disk (signatures re-checked)."""
        if self._closed:
            raise ValueError(f"journal {self.path} is closed")
        if self._fd < 0:
            return
        yield from self._frames.records(self._synced_end)

    def recorded_call(self, state: EffectState) -> str:
        """The call ``state``'s newest intent recorded, in words (``charge('a', 10)``)."""
        intent = state.intent
        if intent is None:
            return f"{state.key} (an outcome without a recorded call)"
        return render_call(intent.name, intent.args_text, intent.input_hash)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._closed
