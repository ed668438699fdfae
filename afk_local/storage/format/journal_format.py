"""The on-disk format of ``effects.log``: frames, their signatures, and reading them back.

Each record is one frame::

    length (u32 LE) | crc32 (u32 LE) | msgpack(Effect)

``length`` is the number of msgpack bytes (1 .. ``max_frame_bytes``); the
crc32 covers exactly those msgpack bytes, not the length field (a damaged
length is caught because the crc then runs over the wrong bytes). In a keyed
store (``integrity.py``) bit 31 of ``length`` is set and a 32-byte HMAC-SHA256,
chained on the previous record's, follows the msgpack bytes; the crc then
covers the msgpack bytes and the MAC.

The frame itself, and telling a torn tail from corruption, is
:mod:`~afk_local.storage.format.frames` (shared with the LangGraph saver's files).
This module knows the Effect records in those frames: it scans a file frame by
frame, checks the signature chain, decides what a bad frame means for a journal,
and reads a whole journal for the storage tools that only look
(:func:`read_journal`: the reader, verify, gc, fork, export). The index, group
commit and replay live in :mod:`afk_local.journal.journal`, the writer's side;
docs/journal.md describes the format.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from afk_local.errors import EffectLogCorruptionError
from afk_local.storage import fsio
from afk_local.storage.format.codec import RecordCodec
from afk_local.storage.format.frames import (
    FRAME_HEADER_SIZE,
    MAX_FRAME_BYTES,
    BadFrame,
    encode_frame,
    frame_after,
    iter_frames,
)
from afk_local.storage.format.integrity import MAC_SIZE, NO_MAC, Signer, record_digest
from afk_local.storage.format.records import Effect

DEFAULT_MAX_FRAME_BYTES = 64 << 20
# Every Effect frame body starts with a msgpack map header and then the first
# field name, "kind": the resync search after a bad frame looks for this.
_FIELD_KIND = b"\xa4kind"


@dataclass(frozen=True)
class TornTail:
    """A damaged last frame found on open: a write a crash cut short."""

    offset: int
    """Where the damaged frame starts (the file is valid up to here)."""
    dropped_bytes: int
    reason: str


class EffectHead(msgspec.Struct):
    """The fields of an Effect the index needs; msgspec skips the rest (results) cheaply."""

    kind: str
    key: str
    input_hash: str = ""
    status: str | None = None


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


@dataclass(frozen=True)
class Scan:
    """What reading a journal file from its start found."""

    end: int
    """Where the valid frames end: the file's size, or where a torn tail starts."""
    last_mac: bytes
    """The chain value the next signed record links to."""
    signed_count: int
    torn_tail: TornTail | None


class RecordOrder:
    """The order every writer appends one key's records in: a call's outcome follows its
    intent, once (a retry appends a new intent first); a key written only as outcomes (a
    patch decision, a limit) never gets an intent. Frames swapped or moved break it: in
    an unkeyed journal, whose frames carry a crc each and no chain, that is the only trace
    (docs/journal.md, "Frames out of order"), so a done call is never read as in doubt."""

    _OUTCOMES, _OPEN, _CLOSED = 0, 1, 2

    def __init__(self, path: str, run_id: str | None) -> None:
        self._path, self._run_id = path, run_id
        self._state: dict[str, int] = {}

    def problem(self, head: EffectHead) -> str | None:
        """Why ``head`` may not come next (None: it may)."""
        state = self._state.get(head.key)
        if head.kind == "intent" and state == self._OUTCOMES:
            return f"an intent of {head.key!r} follows an outcome recorded without one"
        if head.kind != "intent" and state == self._CLOSED:
            return f"a second outcome of {head.key!r} follows one intent"
        return None

    def note(self, head: EffectHead) -> None:
        """``head`` came next."""
        state = self._state.get(head.key)
        if head.kind == "intent":
            self._state[head.key] = self._OPEN
        else:
            self._state[head.key] = self._CLOSED if state == self._OPEN else self._OUTCOMES

    def check(self, offset: int, head: EffectHead) -> None:
        """Raise EffectLogCorruptionError when the record at ``offset`` is out of order."""
        problem = self.problem(head)
        if problem is not None:
            raise EffectLogCorruptionError(
                self._path, offset, f"records out of order ({problem})", self._run_id
            )
        self.note(head)


class FrameReader:
    """Reads and checks the frames of one open ``effects.log`` descriptor.

    Args:
        fd: the open file (read with ``pread``; the caller closes it).
        path: the file, for messages.
        run_id: the run it belongs to (messages and signatures).
        max_frame: the largest msgpack body accepted.
        signer: checks the signature chain in a keyed store (None: unkeyed).
    """

    def __init__(
        self,
        fd: int,
        path: Path,
        run_id: str,
        max_frame: int,
        signer: Signer | None,
        *,
        ext_hook: Callable[[int, memoryview], Any] | None = None,
    ) -> None:
        self._fd = fd
        self._path = path
        self._run_id = run_id
        self._max_frame = max_frame
        self._signer = signer
        self._head_decoder = msgspec.msgpack.Decoder(EffectHead)
        self.order: RecordOrder | None = None
        """What the last ordered :meth:`scan` saw of each key (a writer goes on from it)."""
        self._decoder = msgspec.msgpack.Decoder(Effect, ext_hook=ext_hook)

    def scan(
        self, size: int, apply: Callable[[int, int, EffectHead], None], *, ordered: bool = True
    ) -> Scan:
        """Check every frame in ``[0, size)`` and hand each to ``apply(offset, length, head)``.

        With ``ordered`` (every reader but one that only looks for the last whole frame)
        each key's records are checked to come in :class:`RecordOrder`.

        ``length`` is the frame's size after its header (msgpack bytes and any MAC).
        A bad frame with no valid frame after it is a torn tail (returned, not
        repaired); one with a valid frame after it is corruption.

        Raises:
            EffectLogCorruptionError: a bad frame before good ones, a record that
                does not decode, (keyed) a signature that does not verify, or (``ordered``)
                records out of order.
        """
        last_mac = NO_MAC
        signed = 0
        order = RecordOrder(str(self._path), self._run_id) if ordered else None
        self.order = order
        try:
            keyed = self._signer is not None
            for pos, body, mac in iter_frames(self._fd, 0, size, self._max_frame):
                if mac is None and not keyed:  # the unkeyed path stays as lean as before
                    head = self._decode_head(pos, body)
                    if order is not None:
                        order.check(pos, head)
                    apply(pos, len(body), head)
                    continue
                last_mac = self._check_mac(pos, body, mac, last_mac)
                head = self._decode_head(pos, body)
                if order is not None:
                    order.check(pos, head)
                if mac is not None:
                    signed += 1
                apply(pos, len(body) + (0 if mac is None else MAC_SIZE), head)
        except BadFrame as bad:
            after = self._valid_frame_after(bad.offset + 1, size)
            if after is not None:
                raise EffectLogCorruptionError(
                    str(self._path),
                    bad.offset,
                    f"{bad.reason} (a valid record follows at byte {after})",
                    self._run_id,
                ) from None
            torn = TornTail(bad.offset, size - bad.offset, bad.reason)
            return Scan(bad.offset, last_mac, signed, torn)
        return Scan(size, last_mac, signed, None)

    def records(self, end: int) -> Iterator[Effect]:
        """Every record in ``[0, end)`` in file order, decoded in full (signatures re-checked).

        Raises:
            EffectLogCorruptionError: the file changed since it was scanned.
        """
        prev = NO_MAC
        keyed = self._signer is not None
        try:
            for offset, body, mac in iter_frames(self._fd, 0, end, self._max_frame):
                if keyed:
                    prev = self._check_mac(offset, body, mac, prev)
                yield self._decode(offset, body)
        except BadFrame as bad:
            raise EffectLogCorruptionError(
                str(self._path), bad.offset, f"{bad.reason} (changed since open)", self._run_id
            ) from None

    def read_record(self, offset: int, length: int) -> Effect:
        """The record of the frame at ``offset`` (``length``: its size after the header).

        Signatures are not checked here: :meth:`scan` checked them in chain order.
        """
        for _, body, _ in iter_frames(
            self._fd, offset, offset + FRAME_HEADER_SIZE + length, length
        ):
            return self._decode(offset, body)
        raise EffectLogCorruptionError(str(self._path), offset, "record vanished", self._run_id)

    def _decode(self, offset: int, body: memoryview) -> Effect:
        try:
            return self._decoder.decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise EffectLogCorruptionError(
                str(self._path), offset, f"record does not decode: {exc}", self._run_id
            ) from None

    def _check_mac(
        self, offset: int, body: memoryview, mac: memoryview | None, prev: bytes
    ) -> bytes:
        """Check a record's signature in a keyed store; returns the next chain value."""
        if self._signer is None:
            return NO_MAC if mac is None else bytes(mac)
        if mac is None:
            raise EffectLogCorruptionError(
                str(self._path),
                offset,
                "unsigned record in a keyed store (written without the key, or its "
                "signature was removed)",
                self._run_id,
            )
        expected = self._signer.effect_mac(self._run_id, prev, record_digest(body))
        if not self._signer.matches(expected, mac):
            raise EffectLogCorruptionError(
                str(self._path),
                offset,
                "HMAC mismatch: edited, signed with another key, copied from another run, "
                "or a record before it was deleted or reordered",
                self._run_id,
            )
        return expected

    def _decode_head(self, offset: int, body: memoryview) -> EffectHead:
        try:
            head = self._head_decoder.decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            # The crc matched, so this is no torn write: the bytes are not an Effect.
            raise EffectLogCorruptionError(
                str(self._path), offset, f"record does not decode: {exc}", self._run_id
            ) from None
        if head.kind not in ("intent", "outcome"):
            raise EffectLogCorruptionError(
                str(self._path), offset, f"unknown record kind {head.kind!r}", self._run_id
            )
        return head

    def _valid_frame_after(self, start: int, end: int) -> int | None:
        """The offset of the first whole, crc-valid Effect frame at or after ``start``."""
        return frame_after(
            self._fd,
            start,
            end,
            self._max_frame,
            marker=_FIELD_KIND,
            marker_offset=FRAME_HEADER_SIZE + 1,  # after the body's map header
            accept=self._is_effect,
        )

    def _is_effect(self, body: memoryview) -> bool:
        try:
            self._head_decoder.decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return False
        return True


def write_journal_file(
    path: str | os.PathLike[str],
    records: Iterable[Effect],
    record_codec: RecordCodec | None = None,
    *,
    run_id: str | None = None,
    env: fsio.Env = fsio.DEFAULT_ENV,
) -> None:
    """Write a new effect journal holding ``records`` (one write, one fsync).

    Frames as above: ``length (u32 LE) | crc32 (u32 LE) | msgpack(Effect)``,
    signed and chained for ``run_id`` when ``record_codec`` has a key (``run_id`` is
    then required). ``path`` must not exist yet; publish it with a rename.
    """
    encoder = record_codec or RecordCodec()
    if encoder.signer is not None and not run_id:
        raise ValueError("a keyed journal is signed for its run: pass run_id")
    env.write_new_file(path, encode_journal(records, encoder, run_id or ""))


@dataclass(frozen=True)
class JournalContents:
    """Everything a read-only look at ``effects.log`` found (see :func:`read_journal`)."""

    records: list[Effect]
    """Every durable record in file order (a torn tail is left out)."""
    torn_tail: TornTail | None
    signed_count: int
    """How many records carry a signature (checked only in a keyed store)."""

    def in_doubt(self) -> list[str]:
        """Keys whose newest intent has no outcome: the call may or may not have run."""
        open_intents: dict[str, bool] = {}
        for record in self.records:
            open_intents[record.key] = record.kind == "intent"
        return [key for key, is_open in open_intents.items() if is_open]


@dataclass(frozen=True)
class JournalSalvage:
    """What can be saved of a damaged ``effects.log`` (see :func:`salvage_journal`)."""

    kept: list[Effect]
    """The intact prefix: every record before the first damaged one, in file order."""
    damage_offset: int | None
    """Where the damage starts (None: the journal is intact, or only its tail is torn)."""
    reason: str
    """What is wrong at ``damage_offset``."""
    after: list[Effect]
    """Records after the damage that still decode: lost (unverified, not kept as they are)."""
    lost_bytes: int
    """Bytes from the damage to the end of the file."""


def salvage_journal(
    path: str | os.PathLike[str],
    run_id: str,
    record_codec: RecordCodec | None = None,
    *,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
) -> JournalSalvage:
    """Read ``effects.log`` up to its first damaged record, and what decodes after it.

    Never raises for damage: the intact prefix is whatever verifies (crc, decoding and,
    keyed, the signature chain) from the start. Records after the damage are decoded
    only to report them (in a keyed store their chain hangs on the damaged record, so
    nothing vouches for them).
    """
    try:
        fd = fsio.open_regular(path)
    except FileNotFoundError:
        return JournalSalvage([], None, "", [], 0)
    try:
        the_codec = record_codec or RecordCodec()
        max_frame = min(max_frame_bytes, MAX_FRAME_BYTES)
        frames = FrameReader(
            fd, Path(path), run_id, max_frame, the_codec.signer, ext_hook=the_codec.ext_hook
        )
        size = os.fstat(fd).st_size
        kept: list[Effect] = []
        try:
            kept.extend(frames.records(size))
        except EffectLogCorruptionError as exc:
            damage, reason = exc.offset, exc.reason.removesuffix(" (changed since open)")
        else:
            return JournalSalvage(kept, None, "", [], 0)
        after: list[Effect] = []
        start = frames._valid_frame_after(damage + 1, size)
        while start is not None:
            try:
                for offset, body, _ in iter_frames(fd, start, size, max_frame):
                    with contextlib.suppress(EffectLogCorruptionError):
                        after.append(frames._decode(offset, body))
                break
            except BadFrame as bad:
                start = frames._valid_frame_after(bad.offset + 1, size)
        if not after:  # nothing valid follows: a torn tail, which a writer truncates
            return JournalSalvage(kept, None, "", [], 0)
        return JournalSalvage(kept, damage, reason, after, size - damage)
    finally:
        os.close(fd)


def read_journal(
    path: str | os.PathLike[str],
    run_id: str,
    record_codec: RecordCodec | None = None,
    *,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
) -> JournalContents:
    """Read a whole ``effects.log`` without changing it (a missing file reads as empty).

    Every record is decoded in full and, in a keyed store, its signature checked;
    a torn tail is reported, not repaired (the run's next writer repairs it).

    Raises:
        EffectLogCorruptionError: a bad frame with good frames after it, a record
            that does not decode, or (keyed) a signature that does not verify.
    """
    try:
        fd = fsio.open_regular(path)
    except FileNotFoundError:
        return JournalContents([], None, 0)
    try:
        the_codec = record_codec or RecordCodec()
        frames = FrameReader(
            fd,
            Path(path),
            run_id,
            min(max_frame_bytes, MAX_FRAME_BYTES),
            the_codec.signer,
            ext_hook=the_codec.ext_hook,
        )
        scan = frames.scan(os.fstat(fd).st_size, lambda _offset, _length, _head: None)
        return JournalContents(list(frames.records(scan.end)), scan.torn_tail, scan.signed_count)
    finally:
        os.close(fd)
