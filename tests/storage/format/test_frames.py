"""The one frame codec (afk_local/storage/format/frames.py): bytes pinned, round trips,
and a torn tail told from damage, over a file descriptor and over bytes alike."""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from afk_local.storage.format.frames import (
    FRAME_HEADER_SIZE,
    SIGNED_FRAME,
    BadFrame,
    FrameSource,
    encode_frame,
    encode_msgpack_frame,
    frame_after,
    iter_frames,
    last_frame_header,
)
from afk_local.storage.format.integrity import MAC_SIZE

MAX = 1 << 20
bodies = st.lists(st.binary(min_size=1, max_size=300), min_size=1, max_size=8)
macs = st.one_of(st.none(), st.binary(min_size=MAC_SIZE, max_size=MAC_SIZE))


@contextmanager
def sources(data: bytes, tmp: Path) -> Iterator[list[FrameSource]]:
    """The same bytes as bytes and as an open file descriptor."""
    path = tmp / f"frames-{os.getpid()}-{zlib.crc32(data)}"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        yield [data, fd]
    finally:
        os.close(fd)
        path.unlink()


def read_all(source: FrameSource, end: int) -> list[tuple[int, bytes, bytes | None]]:
    return [
        (offset, bytes(body), None if mac is None else bytes(mac))
        for offset, body, mac in iter_frames(source, 0, end, MAX)
    ]


def test_the_bytes_on_disk_are_pinned() -> None:
    """The LangGraph saver's writes and index frames, byte for byte as before."""
    frame = encode_msgpack_frame(("ns", "cid", "task", "path", [(0, "ch", "json", b"{}")]))
    assert frame.hex() == (
        "2100000071b2552595a26e73a3636964a47461736ba470617468919400a26368a46a736f6ec4027b7d"
    )
    assert encode_msgpack_frame(("x",)).hex() == "03000000737f52ea91a178"
    body, mac = b"effect", bytes(range(MAC_SIZE))
    assert encode_frame(body) == struct.pack("<II", len(body), zlib.crc32(body)) + body
    assert encode_frame(body, mac) == struct.pack(
        "<II", len(body) | SIGNED_FRAME, zlib.crc32(body + mac)
    ) + (body + mac)


@given(bodies=bodies, mac=macs)
def test_frames_round_trip_over_bytes_and_a_file(
    tmp_path_factory: pytest.TempPathFactory, bodies: list[bytes], mac: bytes | None
) -> None:
    data = b"".join(encode_frame(b, mac) for b in bodies)
    with sources(data, tmp_path_factory.getbasetemp()) as both:
        for source in both:
            got = read_all(source, len(data))
            assert [(b, m) for _, b, m in got] == [(b, mac) for b in bodies]
            assert frame_after(source, 0, len(data), MAX) == 0
    if mac is None:
        assert last_frame_header(data) == (len(bodies[-1]), zlib.crc32(bodies[-1]))


@given(bodies=bodies, cut=st.integers(min_value=1))
def test_a_cut_last_frame_is_a_torn_tail(
    tmp_path_factory: pytest.TempPathFactory, bodies: list[bytes], cut: int
) -> None:
    """A crash cuts only the last append: the frames before it read, nothing after it."""
    frames = [encode_frame(b) for b in bodies]
    last = sum(map(len, frames[:-1]))
    data = b"".join(frames)[: last + 1 + cut % (len(frames[-1]) - 1)]  # 1 .. len - 1 bytes kept
    with sources(data, tmp_path_factory.getbasetemp()) as both:
        for source in both:
            with pytest.raises(BadFrame) as bad:
                read_all(source, len(data))
            assert bad.value.offset == last
            assert frame_after(source, last + 1, len(data), MAX) is None
            whole = [b for _, b, _ in iter_frames(data, 0, last, MAX)]
            assert whole == bodies[:-1]


@given(bodies=bodies, at=st.integers(min_value=0), flip=st.integers(min_value=1, max_value=255))
def test_a_damaged_frame_before_good_ones_is_damage(
    tmp_path_factory: pytest.TempPathFactory, bodies: list[bytes], at: int, flip: int
) -> None:
    """A flipped byte in any frame but the last: reading stops there, and a whole frame
    is found after it (at the latest, the next one)."""
    bodies = [*bodies, b"last"]
    frames = [encode_frame(b) for b in bodies]
    k = at % (len(frames) - 1)
    start = sum(map(len, frames[:k]))
    data = bytearray(b"".join(frames))
    data[start + at % len(frames[k])] ^= flip
    damaged = bytes(data)
    with sources(damaged, tmp_path_factory.getbasetemp()) as both:
        for source in both:
            with pytest.raises(BadFrame) as bad:
                read_all(source, len(damaged))
            assert bad.value.offset == start
            found = frame_after(source, start + 1, len(damaged), MAX)
            assert found is not None
            assert found <= start + len(frames[k])


def test_marker_and_accept_narrow_the_search() -> None:
    """The journal's search: only offsets where the marker sits, and only bodies it accepts."""
    good = encode_msgpack_frame({"kind": "intent"})
    other = encode_msgpack_frame({"kind": "nope"})
    data = b"\x00" * 5 + other + good
    first, second = 5, 5 + len(other)
    assert frame_after(data, 0, len(data), MAX) == first
    kind = msgspec.msgpack.Decoder(dict[str, str])

    def accept(body: memoryview) -> bool:
        return kind.decode(body)["kind"] == "intent"

    marker = b"\xa4kind"
    found = frame_after(
        data, 0, len(data), MAX, marker=marker, marker_offset=FRAME_HEADER_SIZE + 1, accept=accept
    )
    assert found == second


def test_a_signed_length_is_only_a_length_when_frames_are_unsigned() -> None:
    data = encode_frame(b"body", bytes(MAC_SIZE))
    assert [bytes(b) for _, b, _ in iter_frames(data, 0, len(data), MAX)] == [b"body"]
    with pytest.raises(BadFrame, match="outside"):
        list(iter_frames(data, 0, len(data), MAX, signed=False))
