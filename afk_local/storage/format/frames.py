"""The crc-checked frame: the one codec of every append-only file afk_local writes.

Each record is one frame::

    length (u32 LE) | crc32 (u32 LE) | body [| mac]

``length`` is the number of body bytes (1 .. a caller's maximum); the crc32 covers
the body (and the MAC), not the length field: a damaged length is caught because
the crc then runs over the wrong bytes. A signed frame (the effect journal of a
keyed store) sets bit 31 of ``length`` and carries a 32-byte MAC after the body.
Bodies are msgpack; this module frames bytes and does not decode them.

Files are appended one frame at a time, so a crash can cut only the last frame
short. A bad frame with no whole frame after it is such a *torn tail*; one with a
whole frame after it is damage (:func:`frame_after` tells them apart).

Users: ``effects.log`` (:mod:`~afk_local.storage.format.journal_format`) and the
LangGraph saver's ``langgraph.writes`` and ``langgraph.index``.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import msgspec

from afk_local.storage.format.integrity import MAC_SIZE

FRAME_HEADER = struct.Struct("<II")
"""``length | crc32`` in front of every frame's body."""
FRAME_HEADER_SIZE = FRAME_HEADER.size
SIGNED_FRAME = 0x8000_0000
"""Bit 31 of a frame's length field: a MAC follows the body (a keyed store)."""
MAX_FRAME_BYTES = SIGNED_FRAME - 1
"""The largest body a signed file can hold: bit 31 of the length field marks signed frames."""

_READ_CHUNK = 1 << 20
_ENCODER = msgspec.msgpack.Encoder()

FrameSource = int | bytes
"""Where frames are read from: an open file descriptor (read with ``pread``) or bytes."""


class BadFrame(Exception):
    """A frame that is short, oversized or fails its crc, at byte ``offset``."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(reason)
        self.offset = offset
        self.reason = reason


def encode_frame(body: bytes, mac: bytes | None = None) -> bytes:
    """One frame: ``length | crc32 | body`` (plus ``mac``, signed, in a keyed store)."""
    if mac is None:
        return FRAME_HEADER.pack(len(body), zlib.crc32(body)) + body
    return FRAME_HEADER.pack(len(body) | SIGNED_FRAME, zlib.crc32(mac, zlib.crc32(body))) + (
        body + mac
    )


def encode_msgpack_frame(value: Any) -> bytes:
    """``value`` as msgpack (msgspec's defaults), in one unsigned frame."""
    return encode_frame(_ENCODER.encode(value))


def iter_frames(
    source: FrameSource, start: int, end: int, max_frame: int, *, signed: bool = True
) -> Iterator[tuple[int, memoryview, memoryview | None]]:
    """Yield ``(offset, body, mac)`` for each crc-checked frame in ``[start, end)``.

    ``source`` is a file descriptor (read in chunks with ``pread``; the caller
    closes it) or the bytes themselves. ``mac`` is a signed frame's trailer (not
    checked here), None for an unsigned frame; with ``signed=False`` a length with
    bit 31 set is only a length, out of bounds unless ``max_frame`` allows it.

    Raises:
        BadFrame: at the first frame that is short, oversized or fails its crc.
    """
    if isinstance(source, int):
        fd, buf, base = source, b"", start  # base: the offset of buf[0]
    else:
        fd, buf, base = -1, source, 0
    # Hot: the journal scans every frame on open, a LangGraph reader every write.
    # Names bound locally and one comparison per check on the common path.
    unpack, crc32, header = FRAME_HEADER.unpack_from, zlib.crc32, FRAME_HEADER_SIZE
    view, have = memoryview(buf), len(buf)
    pos = start
    while pos < end:
        rel = pos - base
        if have - rel < header:
            if fd >= 0:
                buf = buf[rel:] + os.pread(fd, _READ_CHUNK, base + have)
                base, rel, view, have = pos, 0, memoryview(buf), len(buf)
            if have - rel < header:
                raise BadFrame(pos, f"{end - pos} byte(s) left, shorter than a frame header")
        length, crc = unpack(buf, rel)
        if 0 < length <= max_frame:
            size = header + length
        elif signed and length & SIGNED_FRAME and 0 < length & MAX_FRAME_BYTES <= max_frame:
            length &= MAX_FRAME_BYTES  # a signed frame: its MAC follows the body
            size = header + length + MAC_SIZE
        else:
            raise BadFrame(pos, f"frame length {length & MAX_FRAME_BYTES} outside 1..{max_frame}")
        frame_end = pos + size
        if frame_end > end:
            raise BadFrame(
                pos, f"frame of {length} bytes runs {frame_end - end} byte(s) past the end"
            )
        if have - rel < size:
            if fd >= 0:
                missing = size - (have - rel)
                buf = buf[rel:] + os.pread(fd, max(_READ_CHUNK, missing), base + have)
                base, rel, view, have = pos, 0, memoryview(buf), len(buf)
            if have - rel < size:
                raise BadFrame(pos, "file shrank while reading")
        body = view[rel + header : rel + size]
        if crc32(body) != crc:
            raise BadFrame(pos, "crc32 mismatch")
        if size == header + length:
            yield pos, body, None
        else:
            yield pos, body[:length], body[length:]
        pos = frame_end


def frame_after(
    source: FrameSource,
    start: int,
    end: int,
    max_frame: int,
    *,
    signed: bool = True,
    marker: bytes = b"",
    marker_offset: int = 0,
    accept: Callable[[memoryview], bool] | None = None,
) -> int | None:
    """The offset of the first whole, crc-valid frame at or after ``start``; None if none.

    This is the torn-tail check: after a bad frame at ``pos``, ``frame_after(pos + 1)``
    is None for a torn tail and an offset for damage.

    Args:
        source: a file descriptor or bytes, as for :func:`iter_frames`.
        start: the first offset tried.
        end: where the frames end (the file's size).
        max_frame: the largest body accepted.
        signed: accept signed frames (see :func:`iter_frames`).
        marker: bytes every valid frame holds ``marker_offset`` bytes after its start
            (the journal's first field name): only offsets where it occurs are tried.
            Empty: every offset is tried.
        marker_offset: where ``marker`` sits in a frame.
        accept: a further check of a candidate's body (say, that it decodes).
    """

    def whole(candidate: int) -> bool:
        try:
            for _, body, _ in iter_frames(source, candidate, end, max_frame, signed=signed):
                return accept is None or accept(body)
        except BadFrame:
            return False
        return False

    if not marker:
        return next((c for c in range(start, end - FRAME_HEADER_SIZE) if whole(c)), None)
    chunk_start = start
    while chunk_start < end:
        if isinstance(source, int):
            chunk = os.pread(source, _READ_CHUNK + len(marker) + 64, chunk_start)
        else:
            chunk = source[chunk_start : chunk_start + _READ_CHUNK + len(marker) + 64]
        hit = chunk.find(marker)
        while hit >= 0:
            candidate = chunk_start + hit - marker_offset
            if candidate >= start and whole(candidate):
                return candidate
            hit = chunk.find(marker, hit + 1)
        chunk_start += _READ_CHUNK
    return None


def last_frame_header(data: bytes) -> tuple[int, int] | None:
    """``(length, crc32)`` of the last frame of ``data``, a whole number of unsigned
    frames (None when it holds none)."""
    pos, last = 0, None
    while len(data) - pos >= FRAME_HEADER_SIZE:
        last = FRAME_HEADER.unpack_from(data, pos)
        pos += FRAME_HEADER_SIZE + last[0]
    return None if last is None else (int(last[0]), int(last[1]))


__all__ = [
    "FRAME_HEADER",
    "FRAME_HEADER_SIZE",
    "MAX_FRAME_BYTES",
    "SIGNED_FRAME",
    "BadFrame",
    "FrameSource",
    "encode_frame",
    "encode_msgpack_frame",
    "frame_after",
    "iter_frames",
    "last_frame_header",
]
