"""The crc-framed records of the LangGraph saver's side files.

``langgraph.writes`` and ``langgraph.index`` are sequences of frames
``length (u32 LE) | crc32 of the body (u32 LE) | msgpack body``, appended one
write at a time. A frame that does not check out at the tail is a torn append;
one followed by good frames is damage. This module needs no LangGraph.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from typing import Any

import msgspec

FRAME_HEADER = struct.Struct("<II")
"""``length | crc32`` in front of every frame's body."""

_ENCODER = msgspec.msgpack.Encoder()


def encode_frame(value: Any) -> bytes:
    """``value`` as msgpack, framed with its length and crc32."""
    body = _ENCODER.encode(value)
    return FRAME_HEADER.pack(len(body), zlib.crc32(body)) + body


def bad_frame(data: bytes, pos: int, max_bytes: int) -> str | None:
    """Why the frame at ``pos`` is unusable, or None when its length and crc check out."""
    if len(data) - pos < FRAME_HEADER.size:
        return "short header"
    length, crc = FRAME_HEADER.unpack_from(data, pos)
    if length == 0 or length > max_bytes:
        return f"bad length {length}"
    start = pos + FRAME_HEADER.size
    if start + length > len(data):
        return "short body"
    if zlib.crc32(data[start : start + length]) != crc:
        return "crc32 mismatch"
    return None


def frame_body(data: bytes, pos: int) -> tuple[bytes, int]:
    """The body of the (checked) frame at ``pos`` and the offset just after the frame."""
    length, _ = FRAME_HEADER.unpack_from(data, pos)
    end = pos + FRAME_HEADER.size + length
    return data[pos + FRAME_HEADER.size : end], end


def last_frame_header(data: bytes) -> tuple[int, int] | None:
    """``(length, crc32)`` of the last frame of ``data``, a whole number of frames
    (None when it holds none)."""
    pos, last = 0, None
    while len(data) - pos >= FRAME_HEADER.size:
        last = FRAME_HEADER.unpack_from(data, pos)
        pos += FRAME_HEADER.size + last[0]
    return None if last is None else (int(last[0]), int(last[1]))


def has_valid_frame_after(data: bytes, pos: int, max_bytes: int) -> bool:
    """True when a well-formed frame starts somewhere after the bad one at ``pos``."""
    for start in range(pos + 1, len(data) - FRAME_HEADER.size):
        if bad_frame(data, start, max_bytes) is None:
            return True
    return False


__all__: Sequence[str] = [
    "FRAME_HEADER",
    "bad_frame",
    "encode_frame",
    "frame_body",
    "has_valid_frame_after",
    "last_frame_header",
]
