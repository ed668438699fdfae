"""The effect journal (``effects.log``): side effects happen once, or are reported in doubt.

Each record is one frame, appended with a single write on an ``O_APPEND``
descriptor and fsynced before :meth:`Journal.append` returns::

    length (u32 LE) | crc32 (u32 LE) | msgpack(Effect)

``length`` is the number of msgpack bytes (1 .. ``max_frame_bytes``); the
crc32 covers exactly those msgpack bytes, not the length field (a damaged
length is caught because the crc then runs over the wrong bytes). In a keyed
store (``integrity.py``) bit 31 of ``length`` is set and a 32-byte HMAC-SHA256,
chained on the previous record's, follows the msgpack bytes; the crc then
covers the msgpack bytes and the MAC. A call is
journaled in two records, an ``intent`` before the function runs and an
``outcome`` after it returned (DESIGN §3). :meth:`Journal.call` holds the
replay logic; docs/journal.md describes the format and the replay rules.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import hashlib
import inspect
import logging
import os
import struct
import threading
import time
import traceback
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from afk_local import fsio
from afk_local.codec import EncHook, RecordCodec
from afk_local.errors import (
    EffectInDoubtError,
    EffectLogCorruptionError,
    EffectMismatchError,
    WriterFailedError,
)
from afk_local.integrity import MAC_SIZE, NO_MAC, Signer, record_digest
from afk_local.records import Effect, ErrorInfo

log = logging.getLogger("afk_local")

_FRAME_HEADER = struct.Struct("<II")
FRAME_HEADER_SIZE = _FRAME_HEADER.size
DEFAULT_MAX_FRAME_BYTES = 64 << 20
SIGNED_FRAME = 0x8000_0000
"""Bit 31 of a frame's length field: a MAC follows the msgpack bytes (a keyed store)."""
_LENGTH_MASK = SIGNED_FRAME - 1
_READ_CHUNK = 1 << 20
# Every Effect frame body starts with a msgpack map header and then the first
# field name, "kind": the resync search after a bad frame looks for this.
_FIELD_KIND = b"\xa4kind"
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)

InDoubtPolicy = str | Callable[["EffectState"], str]


def input_hash(
    name: str,
    args: tuple[Any, ...] | list[Any],
    kwargs: dict[str, Any],
    *,
    enc_hook: EncHook | None = None,
) -> str:
    """The blake2b (128-bit, hex) digest of the canonical msgpack of ``(name, args, kwargs)``.

    Canonical: map keys and struct fields sorted, tuples and lists both arrays,
    so equal inputs hash equally across processes and Python versions.

    >>> input_hash("send", ("a@b.c",), {}) == input_hash("send", ["a@b.c"], {})
    True
    """
    data = _canonical_encoder(enc_hook).encode((name, list(args), kwargs))
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def idempotency_key(run_id: str, key: str) -> str:
    """A stable key derived from ``(run_id, key)``, safe to send to outside services.

    It is ``"afk-"`` and 32 hex digits: the same for every attempt of the same
    effect, different across runs and keys.
    """
    digest = hashlib.blake2b(
        f"{run_id}\0{key}".encode(), digest_size=16, person=b"afk-idempotency"
    ).hexdigest()
    return f"afk-{digest}"


@functools.lru_cache(maxsize=64)
def _canonical_encoder(enc_hook: EncHook | None) -> msgspec.msgpack.Encoder:
    return msgspec.msgpack.Encoder(enc_hook=enc_hook, order="sorted")


class ReplayedError(Exception):
    """Raised when :meth:`Journal.call` replays an outcome recorded as an error.

    Each replayed error is an instance of a subclass named like the recorded
    type; when that name is a builtin exception (``ValueError``, ``KeyError``,
    ``OSError``...) the subclass also derives from the builtin, so ``except
    ValueError`` still catches it. ``str()`` is the recorded message.
    """

    def __init__(self, info: ErrorInfo, key: str) -> None:
        # Set args directly: a mixed-in builtin's __init__ may want other arguments.
        self.args = (info.message,)
        self.info = info
        self.key = key

    def __str__(self) -> str:
        return self.info.message


@functools.lru_cache(maxsize=256)
def _replayed_type(type_name: str, mix_builtin: bool) -> type[ReplayedError]:
    builtin = getattr(builtins, type_name, None) if mix_builtin else None
    if isinstance(builtin, type) and issubclass(builtin, Exception):
        try:
            return type(type_name, (ReplayedError, builtin), {"__module__": __name__})
        except TypeError:  # a builtin whose layout cannot be mixed in
            pass
    return type(type_name, (ReplayedError,), {"__module__": __name__})


def replayed_error(info: ErrorInfo, key: str) -> ReplayedError:
    """The exception :meth:`Journal.call` raises for a recorded error outcome."""
    name = info.type if info.type.isidentifier() else "ReplayedError"
    try:
        cls = _replayed_type(name, True)
        error = cls.__new__(cls, info.message)
    except TypeError:  # e.g. UnicodeDecodeError, ExceptionGroup: not from a message alone
        cls = _replayed_type(name, False)
        error = cls.__new__(cls, info.message)
    ReplayedError.__init__(error, info, key)
    return error


@dataclass(frozen=True)
class TornTail:
    """A damaged last frame found on open: a write a crash cut short."""

    offset: int
    """Where the damaged frame starts (the file is valid up to here)."""
    dropped_bytes: int
    reason: str


class _Entry:
    """Index slot for one key: offsets, not records, so memory stays small."""

    __slots__ = ("attempts", "input_hash", "intent_at", "outcome_at", "status")

    def __init__(self) -> None:
        self.intent_at: tuple[int, int] | None = None  # (offset, length) of the newest intent
        self.outcome_at: tuple[int, int] | None = None  # its outcome, if any
        self.input_hash = ""
        self.status: str | None = None
        self.attempts = 0


class _Head(msgspec.Struct):
    """The fields of an Effect the index needs; msgspec skips the rest (results) cheaply."""

    kind: str
    key: str
    input_hash: str = ""
    status: str | None = None


class EffectState:
    """What the journal knows about one key. The records are read from disk on first use."""

    __slots__ = ("_entry", "_intent", "_journal", "_outcome", "key")

    def __init__(self, journal: Journal, key: str, entry: _Entry) -> None:
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


class _BadFrame(Exception):
    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(reason)
        self.offset = offset
        self.reason = reason


def _iter_frames(
    fd: int, start: int, end: int, max_frame: int
) -> Iterator[tuple[int, memoryview, memoryview | None]]:
    """Yield ``(offset, body, mac)`` for each crc-checked frame in ``[start, end)``.

    ``mac`` is the signed trailer (not checked here), None for an unsigned frame.
    Raises _BadFrame at the first frame that is short, oversized or fails its crc.
    """
    buf = b""
    base = start  # file offset of buf[0]
    pos = start
    while pos < end:
        rel = pos - base
        if len(buf) - rel < FRAME_HEADER_SIZE:
            buf = buf[rel:] + os.pread(fd, _READ_CHUNK, base + len(buf))
            base, rel = pos, 0
            if len(buf) < FRAME_HEADER_SIZE:
                raise _BadFrame(pos, f"{end - pos} byte(s) left, shorter than a frame header")
        length, crc = _FRAME_HEADER.unpack_from(buf, rel)
        trailer = 0
        if length == 0 or length > max_frame:  # out of bounds, or a signed frame
            if length & SIGNED_FRAME and 0 < length & _LENGTH_MASK <= max_frame:
                length &= _LENGTH_MASK
                trailer = MAC_SIZE
            else:
                length &= _LENGTH_MASK
                raise _BadFrame(pos, f"frame length {length} outside 1..{max_frame}")
        size = FRAME_HEADER_SIZE + length + trailer
        frame_end = pos + size
        if frame_end > end:
            raise _BadFrame(
                pos, f"frame of {length} bytes runs {frame_end - end} byte(s) past the end"
            )
        if len(buf) - rel < size:
            missing = size - (len(buf) - rel)
            buf = buf[rel:] + os.pread(fd, max(_READ_CHUNK, missing), base + len(buf))
            base, rel = pos, 0
            if len(buf) < size:
                raise _BadFrame(pos, "file shrank while reading")
        view = memoryview(buf)[rel + FRAME_HEADER_SIZE : rel + size]
        if zlib.crc32(view) != crc:
            raise _BadFrame(pos, "crc32 mismatch")
        if trailer:
            yield pos, view[:length], view[length:]
        else:
            yield pos, view, None
        pos = frame_end


def encode_frame(body: bytes, mac: bytes | None = None) -> bytes:
    """One journal frame: ``length | crc32 | body`` (plus ``mac``, signed, in a keyed store)."""
    if mac is None:
        return _FRAME_HEADER.pack(len(body), zlib.crc32(body)) + body
    return _FRAME_HEADER.pack(len(body) | SIGNED_FRAME, zlib.crc32(mac, zlib.crc32(body))) + (
        body + mac
    )


def encode_journal(records: Iterable[Effect], record_codec: RecordCodec, run_id: str) -> bytes:
    """The bytes of a whole journal holding ``records`` (signed and chained when keyed)."""
    signer = record_codec.signer
    prev = NO_MAC
    chunks = []
    for record in records:
        body = record_codec.encode(record)
        mac = None
        if signer is not None:
            mac = prev = signer.effect_mac(run_id, prev, record_digest(body))
        chunks.append(encode_frame(body, mac))
    return b"".join(chunks)


def _accepts_idempotency_key(fn: Callable[..., Any]) -> bool:
    try:
        return _accepts_cached(fn)
    except TypeError:  # unhashable callable
        return _accepts_uncached(fn)


@functools.lru_cache(maxsize=1024)
def _accepts_cached(fn: Callable[..., Any]) -> bool:
    return _accepts_uncached(fn)


def _accepts_uncached(fn: Callable[..., Any]) -> bool:
    try:
        param = inspect.signature(fn).parameters.get("idempotency_key")
    except (TypeError, ValueError):
        return False
    return param is not None and param.kind in (
        inspect.Parameter.KEYWORD_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    )


def _error_info(exc: BaseException) -> ErrorInfo:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return ErrorInfo(type=type(exc).__name__, message=str(exc), traceback=text)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class Journal:
    """An open ``effects.log``: an in-memory index over an append-only file.

    Opening scans the file once. A damaged last frame is a torn write from a
    crash: a writable journal truncates it, a read-only one ignores it; either
    way it is reported in :attr:`torn_tail`. A damaged frame with good frames
    after it raises :class:`EffectLogCorruptionError`.

    Args:
        path: the journal file (created 0600 when writable and missing).
        run_id: the run it belongs to (used in messages and idempotency keys).
        writable: open for appending; the caller must own the run's lock.
        record_codec: encodes records (its ``enc_hook`` applies to results).
        max_frame_bytes: largest record accepted on write and on read.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        run_id: str,
        *,
        writable: bool,
        record_codec: RecordCodec | None = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> None:
        self.path = Path(path)
        self.run_id = run_id
        self.writable = writable
        self.torn_tail: TornTail | None = None
        self.replayed_count = 0
        """How many :meth:`call` invocations this instance replayed instead of executing."""
        self._codec = record_codec or RecordCodec()
        self._signer: Signer | None = self._codec.signer
        self._last_mac = NO_MAC  # the chain value the next signed record links to
        self.signed_count = 0
        """How many records carry a signature (checked only in a keyed store)."""
        self._enc_hook: EncHook | None = self._codec.enc_hook
        self._max_frame = min(max_frame_bytes, _LENGTH_MASK)  # bit 31 marks signed frames
        self._head_decoder = msgspec.msgpack.Decoder(_Head)
        self._decoder = msgspec.msgpack.Decoder(Effect)
        self._index: dict[str, _Entry] = {}
        self._count = 0
        self._cond = threading.Condition(threading.Lock())
        self._failed: BaseException | None = None
        self._closed = False
        self._syncing = False
        self._pending: list[tuple[int, int, _Head]] = []  # written, not yet fsynced
        self._in_flight: set[str] = set()
        self._fd = self._open()
        try:
            self._end = self._load()
        except BaseException:
            os.close(self._fd)
            raise
        self._written_end = self._synced_end = self._end

    def _open(self) -> int:
        if not self.writable:
            try:
                return os.open(self.path, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC)
            except FileNotFoundError:
                return -1  # no journal yet: an empty view
        existed = self.path.exists()
        fd = fsio.open_append(self.path)
        if not existed:
            try:
                fsio.fsync_dir(self.path.parent)  # the new entry must survive a crash too
            except BaseException:
                os.close(fd)
                raise
        return fd

    # -- opening ------------------------------------------------------------------

    def _load(self) -> int:
        if self._fd < 0:
            return 0
        size = os.fstat(self._fd).st_size
        try:
            keyed = self._signer is not None
            for pos, body, mac in _iter_frames(self._fd, 0, size, self._max_frame):
                if mac is None and not keyed:  # the unkeyed path stays as lean as before
                    self._apply(pos, len(body), self._decode_head(pos, body))
                    continue
                self._last_mac = self._check_mac(pos, body, mac, self._last_mac)
                head = self._decode_head(pos, body)
                if mac is not None:
                    self.signed_count += 1
                self._apply(pos, len(body) + (0 if mac is None else MAC_SIZE), head)
        except _BadFrame as bad:
            after = self._valid_frame_after(bad.offset + 1, size)
            if after is not None:
                raise EffectLogCorruptionError(
                    str(self.path),
                    bad.offset,
                    f"{bad.reason} (a valid record follows at byte {after})",
                    self.run_id,
                ) from None
            self.torn_tail = TornTail(bad.offset, size - bad.offset, bad.reason)
        else:
            return size
        torn = self.torn_tail
        if self.writable:
            fsio.truncate(self._fd, torn.offset, self.path)
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

    def _check_mac(
        self, offset: int, body: memoryview, mac: memoryview | None, prev: bytes
    ) -> bytes:
        """Check a record's signature in a keyed store; returns the next chain value."""
        if self._signer is None:
            return NO_MAC if mac is None else bytes(mac)
        if mac is None:
            raise EffectLogCorruptionError(
                str(self.path),
                offset,
                "unsigned record in a keyed store (written without the key, or its "
                "signature was removed)",
                self.run_id,
            )
        expected = self._signer.effect_mac(self.run_id, prev, record_digest(body))
        if not self._signer.matches(expected, mac):
            raise EffectLogCorruptionError(
                str(self.path),
                offset,
                "HMAC mismatch: edited, signed with another key, copied from another run, "
                "or a record before it was deleted or reordered",
                self.run_id,
            )
        return expected

    def _decode_head(self, offset: int, body: memoryview) -> _Head:
        try:
            head = self._head_decoder.decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            # The crc matched, so this is no torn write: the bytes are not an Effect.
            raise EffectLogCorruptionError(
                str(self.path), offset, f"record does not decode: {exc}", self.run_id
            ) from None
        if head.kind not in ("intent", "outcome"):
            raise EffectLogCorruptionError(
                str(self.path), offset, f"unknown record kind {head.kind!r}", self.run_id
            )
        return head

    def _valid_frame_after(self, start: int, end: int) -> int | None:
        """The offset of the first whole, crc-valid Effect frame at or after ``start``."""
        chunk_start = start
        while chunk_start < end:
            chunk = os.pread(self._fd, _READ_CHUNK + 64, chunk_start)
            hit = chunk.find(_FIELD_KIND)
            while hit >= 0:
                candidate = chunk_start + hit - FRAME_HEADER_SIZE - 1
                if candidate >= start and self._frame_ok(candidate, end):
                    return candidate
                hit = chunk.find(_FIELD_KIND, hit + 1)
            chunk_start += _READ_CHUNK
        return None

    def _frame_ok(self, offset: int, end: int) -> bool:
        try:
            for _, body, _ in _iter_frames(self._fd, offset, end, self._max_frame):
                self._head_decoder.decode(body)
                return True
        except (_BadFrame, msgspec.DecodeError, msgspec.ValidationError):
            return False
        return False

    def _apply(self, offset: int, length: int, head: _Head) -> None:
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
        # Signatures were checked, in chain order, when the journal was opened.
        if self._closed:
            raise ValueError(f"journal {self.path} is closed")
        for _, body, _ in _iter_frames(
            self._fd, offset, offset + FRAME_HEADER_SIZE + length, length
        ):
            try:
                return self._decoder.decode(body)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                raise EffectLogCorruptionError(
                    str(self.path), offset, f"record does not decode: {exc}", self.run_id
                ) from None
        raise EffectLogCorruptionError(str(self.path), offset, "record vanished", self.run_id)

    # -- reading ------------------------------------------------------------------

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
        end = self._synced_end
        prev = NO_MAC
        keyed = self._signer is not None
        try:
            for offset, body, mac in _iter_frames(self._fd, 0, end, self._max_frame):
                if keyed:
                    prev = self._check_mac(offset, body, mac, prev)
                try:
                    yield self._decoder.decode(body)
                except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                    raise EffectLogCorruptionError(
                        str(self.path), offset, f"record does not decode: {exc}", self.run_id
                    ) from None
        except _BadFrame as bad:
            raise EffectLogCorruptionError(
                str(self.path), bad.offset, f"{bad.reason} (changed since open)", self.run_id
            ) from None

    # -- writing ------------------------------------------------------------------

    def append(self, effect: Effect, *, enc_hook: EncHook | None = None) -> None:
        """Append one record and return once it is on stable storage. Thread-safe.

        Appends that arrive while another thread's fsync is in flight are
        covered together by the next fsync (group commit); none returns before
        the fsync covering its bytes returned. A failed write or fsync makes the
        journal refuse every later append (:class:`WriterFailedError`).
        """
        if not self.writable:
            raise ValueError(f"journal {self.path} of run {self.run_id!r} is open read-only")
        if enc_hook is None:
            body = self._codec.encode(effect)
        else:
            body = msgspec.msgpack.Encoder(enc_hook=enc_hook).encode(effect)
        if len(body) > self._max_frame:
            raise ValueError(
                f"run {self.run_id!r}: effect {effect.key!r} record is {len(body)} bytes, over "
                f"max_frame_bytes={self._max_frame}; return a smaller result (store large data "
                "in a file and journal its path)"
            )
        head = _Head(effect.kind, effect.key, effect.input_hash, effect.status)
        digest = None if self._signer is None else record_digest(body)
        frame = encode_frame(body) if digest is None else b""
        with self._cond:
            self._check_writable()
            mac = None
            if self._signer is not None and digest is not None:
                # The chain follows file order, so the MAC is made under the append lock.
                mac = self._signer.effect_mac(self.run_id, self._last_mac, digest)
                frame = encode_frame(body, mac)
            offset = self._written_end
            try:
                fsio.write_all(self._fd, frame, self.path)
            except BaseException as exc:
                self._failed = exc
                self._cond.notify_all()
                raise WriterFailedError(self.run_id, exc) from exc
            if mac is not None:
                self._last_mac = mac
            self._written_end = mine = offset + len(frame)
            self._pending.append((offset, len(frame) - FRAME_HEADER_SIZE, head))
            while self._synced_end < mine:
                if self._failed is not None:
                    raise WriterFailedError(self.run_id, self._failed)
                if self._closed:  # never fsync a descriptor that close() gave back
                    raise WriterFailedError(self.run_id, RuntimeError("journal closed meanwhile"))
                if self._syncing:
                    self._cond.wait()
                    continue
                self._sync_locked()

    def _sync_locked(self) -> None:
        """Fsync everything written so far; called with the lock held, releases it meanwhile."""
        self._syncing = True
        target = self._written_end
        batch, self._pending = self._pending, []
        self._cond.release()
        error: BaseException | None = None
        try:
            fsio.fsync_fd(self._fd, self.path)
        except BaseException as exc:
            error = exc
        finally:
            self._cond.acquire()
            self._syncing = False
        if error is not None:
            self._failed = error  # never retried: the kernel may have dropped the dirty pages
            self._cond.notify_all()
            raise WriterFailedError(self.run_id, error) from error
        self._synced_end = target
        for offset, length, head in batch:  # the index only ever shows durable records
            self._apply(offset, length, head)
        self._cond.notify_all()

    def _check_writable(self) -> None:
        if self._closed:
            raise WriterFailedError(self.run_id, RuntimeError(f"journal {self.path} is closed"))
        if self._failed is not None:
            raise WriterFailedError(self.run_id, self._failed)

    def record_intent(
        self,
        key: str,
        *,
        name: str,
        input_hash: str,
        idempotency_key: str,
        step: int = 0,
        call_id: str | None = None,
    ) -> Effect:
        """Durably record that the call ``key`` is about to run; returns the record."""
        effect = Effect(
            kind="intent",
            key=key,
            timestamp_ms=_now_ms(),
            step=step,
            call_id=call_id,
            name=name,
            input_hash=input_hash,
            idempotency_key=idempotency_key,
        )
        self.append(effect)
        return effect

    def record_outcome(
        self,
        key: str,
        *,
        status: str,
        result: Any = None,
        error: ErrorInfo | None = None,
        output_hash: str | None = None,
        enc_hook: EncHook | None = None,
    ) -> Effect:
        """Durably record how the call ``key`` ended: ``status`` ``"ok"`` or ``"error"``.

        For ``"ok"`` without ``output_hash``, the blake2b of the result's
        canonical msgpack is stored.
        """
        if status not in ("ok", "error"):
            raise ValueError(f"status must be 'ok' or 'error', not {status!r}")
        hook = enc_hook or self._enc_hook
        if status == "ok" and output_hash is None:
            output_hash = hashlib.blake2b(
                _canonical_encoder(hook).encode(result), digest_size=16
            ).hexdigest()
        effect = Effect(
            kind="outcome",
            key=key,
            timestamp_ms=_now_ms(),
            status=status,
            output_hash=output_hash,
            result=result,
            error=error,
        )
        self.append(effect, enc_hook=enc_hook)
        return effect

    # -- the replay logic -----------------------------------------------------------

    def call(
        self,
        key: str,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        name: str | None = None,
        step: int = 0,
        idempotent: bool = False,
        in_doubt: InDoubtPolicy | None = None,
        retry_errors: bool = False,
        enc_hook: EncHook | None = None,
        result_type: Any = None,
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` at most once per ``key`` across crashes and resumes.

        - An outcome recorded for ``key`` with the same input hash is replayed:
          its result is returned (as msgpack decoded it: lists for tuples, or
          converted to ``result_type``), or its error is raised again as a
          :class:`ReplayedError` of the same type name and message
          (``retry_errors=True`` runs the call again instead).
        - A different input hash raises :class:`EffectMismatchError`.
        - An intent without outcome is in doubt: ``in_doubt`` decides,
          ``"retry"`` (call again with the same idempotency key), ``"raise"``
          (:class:`EffectInDoubtError`) or a callable that gets the
          :class:`EffectState` and returns one of those. None means
          ``"retry"`` when ``idempotent`` else ``"raise"``.
        - Otherwise: intent (durable), call, outcome (durable), return.

        ``fn`` gets ``idempotency_key=...`` when its signature has a parameter
        of that name (``**kwargs`` alone does not count). The default ``name``
        is ``fn.__name__``; it is part of the input hash. Exceptions are
        recorded as error outcomes; BaseExceptions (KeyboardInterrupt,
        SystemExit) are not, leaving the call in doubt, as it may be.

        >>> journal.call("email:42", send_email, ("a@b.c", "hi"))  # doctest: +SKIP
        """
        kwargs = dict(kwargs or {})
        args = tuple(args)
        call_name = name if name is not None else getattr(fn, "__name__", type(fn).__name__)
        digest = input_hash(call_name, args, kwargs, enc_hook=enc_hook or self._enc_hook)
        state = self.lookup(key)
        if state is not None and state.input_hash and state.input_hash != digest:
            recorded = state.intent
            recorded_name = recorded.name if recorded is not None else "?"
            shown = repr((args, kwargs))
            shown = shown if len(shown) <= 200 else shown[:197] + "..."
            raise EffectMismatchError(
                self.run_id,
                key,
                f"{recorded_name}(input hash {state.input_hash})",
                f"{call_name}{shown} (input hash {digest})",
                str(self.path),
            )
        if state is not None and state.status is not None:
            outcome = state.outcome
            assert outcome is not None
            if outcome.status == "ok":
                self.replayed_count += 1
                if result_type is not None:
                    return msgspec.convert(outcome.result, result_type)
                return outcome.result
            if not retry_errors:
                self.replayed_count += 1
                info = outcome.error or ErrorInfo(type="ReplayedError", message="recorded error")
                raise replayed_error(info, key)
        elif state is not None and state.in_doubt:
            policy = in_doubt if in_doubt is not None else ("retry" if idempotent else "raise")
            decision = policy(state) if callable(policy) else policy
            if decision == "raise":
                raise EffectInDoubtError(
                    self.run_id, key, idempotency_key(self.run_id, key), str(self.path)
                )
            if decision != "retry":
                raise ValueError(f"in_doubt policy must give 'retry' or 'raise', not {decision!r}")
            log.warning(
                "run %s: effect %r was in doubt (started, no outcome); calling it again with "
                "idempotency key %s",
                self.run_id, key, idempotency_key(self.run_id, key),
            )  # fmt: skip
        return self._execute(key, fn, args, kwargs, call_name, digest, step, enc_hook)

    def _execute(  # noqa: PLR0917 - private; called from one place
        self,
        key: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        call_name: str,
        digest: str,
        step: int,
        enc_hook: EncHook | None,
    ) -> Any:
        with self._cond:
            if key in self._in_flight:
                raise RuntimeError(f"run {self.run_id!r}: effect {key!r} is already running")
            self._in_flight.add(key)
        try:
            idem = idempotency_key(self.run_id, key)
            self.record_intent(
                key, name=call_name, input_hash=digest, idempotency_key=idem, step=step
            )
            call_kwargs = kwargs
            if "idempotency_key" not in kwargs and _accepts_idempotency_key(fn):
                call_kwargs = {**kwargs, "idempotency_key": idem}
            try:
                result = fn(*args, **call_kwargs)
            except Exception as exc:
                self.record_outcome(key, status="error", error=_error_info(exc))
                raise
            try:
                self.record_outcome(key, status="ok", result=result, enc_hook=enc_hook)
            except (TypeError, msgspec.EncodeError, ValueError) as exc:
                raise TypeError(
                    f"run {self.run_id!r}: effect {key!r} ran, but its result cannot be "
                    f"journaled ({exc}); it stays in doubt. Return msgpack-able data or pass "
                    "enc_hook"
                ) from exc
            return result
        finally:
            with self._cond:
                self._in_flight.discard(key)

    # -- lifetime -----------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._closed

    def close(self) -> None:
        """Close the file once appends in progress are durable (or failed). Idempotent."""
        with self._cond:
            while self._syncing:
                self._cond.wait()
            if self._closed:
                return
            if self._failed is None and self._written_end > self._synced_end:
                with contextlib.suppress(WriterFailedError):  # kept in _failed; close anyway
                    self._sync_locked()
            self._closed = True
            if self._fd >= 0:
                os.close(self._fd)

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "writable" if self.writable else "read-only"
        return f"Journal(run_id={self.run_id!r}, path={str(self.path)!r}, {mode}, n={self._count})"
