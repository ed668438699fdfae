"""The AFK1 file format: round trips, corruption detection, resource bounds."""

from __future__ import annotations

import tracemalloc

import pytest
import zstandard
from frames import huge_declared_frame
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import payloads

from afk_local.errors import CheckpointCorruptionError
from afk_local.storage.format import codec
from afk_local.storage.format.codec import RecordCodec
from afk_local.storage.format.records import SCHEMA_VERSION, Checkpoint, RunMeta


def _checkpoint(seq: int, payload: object) -> Checkpoint:
    return Checkpoint(
        schema_version=SCHEMA_VERSION,
        run_id="r",
        thread_id=None,
        seq=seq,
        step=seq,
        phase="runtime_state",
        timestamp_ms=1,
        payload=payload,
    )


def _decode(data: bytes, base: bytes | None = None) -> bytes:
    header, body = codec.unpack_frame(data, "f", expect_kind=codec.KIND_CHECKPOINT)
    return codec.decompress(
        body, "f", base=base if header.is_delta else None, max_bytes=codec.DEFAULT_MAX_RECORD_BYTES
    )


@settings(max_examples=300, deadline=None)
@given(payloads, payloads)
def test_keyframe_and_delta_round_trip(first: object, second: object) -> None:
    rc = RecordCodec()
    raw1 = rc.encode(_checkpoint(1, first))
    raw2 = rc.encode(_checkpoint(2, second))
    key = codec.pack_frame(codec.KIND_CHECKPOINT, codec.compress(raw1))
    delta = codec.pack_frame(
        codec.KIND_CHECKPOINT, codec.compress(raw2, raw1), flags=codec.FLAG_DELTA, base_seq=1
    )
    assert rc.decode_checkpoint(_decode(key), "f").payload == first
    assert rc.decode_checkpoint(_decode(delta, raw1), "f").payload == second


def test_meta_round_trip() -> None:
    rc = RecordCodec()
    meta = RunMeta(run_id="r", created_ms=1, updated_ms=2, params={"a": [1, 2]})
    assert codec.decode_meta(rc, codec.encode_meta(rc, meta), "m") == meta


def test_large_base_delta_stays_small() -> None:
    # Over ~1 MB, zstd ignores most of a dictionary unless the tables are widened.
    rc = RecordCodec()
    messages = [{"role": "user", "content": f"{i:06d}" + "lorem ipsum " * 40} for i in range(3000)]
    raw1 = rc.encode(_checkpoint(1, messages))
    raw2 = rc.encode(_checkpoint(2, [*messages, {"role": "assistant", "content": "x" * 500}]))
    assert len(raw1) > 1_000_000
    delta = codec.compress(raw2, raw1)
    assert len(delta) < 2_000
    framed = codec.pack_frame(codec.KIND_CHECKPOINT, delta, flags=codec.FLAG_DELTA, base_seq=1)
    assert _decode(framed, raw1) == raw2


def test_delta_against_wrong_base_is_caught() -> None:
    rc = RecordCodec()
    raw1 = rc.encode(_checkpoint(1, {"a": "x" * 300}))
    other = rc.encode(_checkpoint(1, {"a": "y" * 300}))
    raw2 = rc.encode(_checkpoint(2, {"a": "x" * 300, "b": 1}))
    framed = codec.pack_frame(
        codec.KIND_CHECKPOINT, codec.compress(raw2, raw1), flags=codec.FLAG_DELTA, base_seq=1
    )
    with pytest.raises(CheckpointCorruptionError):
        _decode(framed, other)


@pytest.fixture(scope="module")
def sample_files() -> list[tuple[bytes, bytes | None]]:
    """A keyframe and a delta, each with the base it needs."""
    rc = RecordCodec()
    raw1 = rc.encode(_checkpoint(1, {"messages": ["hello world"] * 5}))
    raw2 = rc.encode(_checkpoint(2, {"messages": ["hello world"] * 6}))
    key = codec.pack_frame(codec.KIND_CHECKPOINT, codec.compress(raw1))
    delta = codec.pack_frame(
        codec.KIND_CHECKPOINT, codec.compress(raw2, raw1), flags=codec.FLAG_DELTA, base_seq=1
    )
    return [(key, None), (delta, raw1)]


def test_every_single_byte_flip_is_detected(sample_files: list[tuple[bytes, bytes | None]]) -> None:
    for data, base in sample_files:
        for pos in range(len(data)):
            for mask in (0x01, 0x80, 0xFF):
                damaged = bytearray(data)
                damaged[pos] ^= mask
                with pytest.raises(CheckpointCorruptionError):
                    _decode(bytes(damaged), base)


def test_every_truncation_is_detected(sample_files: list[tuple[bytes, bytes | None]]) -> None:
    for data, base in sample_files:
        for length in range(len(data)):
            with pytest.raises(CheckpointCorruptionError):
                _decode(data[:length], base)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_raise_anything_else(data: bytes) -> None:
    with pytest.raises(CheckpointCorruptionError):
        _decode(codec.MAGIC + data)


def test_crafted_100gb_declared_size_is_refused_without_allocating() -> None:
    body = huge_declared_frame(100 << 30)
    assert zstandard.frame_content_size(body) == 100 << 30
    data = codec.pack_frame(codec.KIND_CHECKPOINT, body)
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointCorruptionError, match="max_record_bytes"):
            _decode(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 10 << 20


def test_frame_over_a_small_bound_is_refused() -> None:
    rc = RecordCodec()
    raw = rc.encode(_checkpoint(1, "x" * 5000))
    data = codec.pack_frame(codec.KIND_CHECKPOINT, codec.compress(raw))
    _, body = codec.unpack_frame(data, "f", expect_kind=codec.KIND_CHECKPOINT)
    with pytest.raises(CheckpointCorruptionError, match="max_record_bytes"):
        codec.decompress(body, "f", base=None, max_bytes=1000)


def test_header_crc_covers_header_fields() -> None:
    data = codec.pack_frame(codec.KIND_CHECKPOINT, codec.compress(b"\x80"))
    # Re-pack a different base_seq with the old crc: must be rejected.
    forged = bytearray(data)
    forged[6] = 7
    with pytest.raises(CheckpointCorruptionError, match="crc32"):
        codec.unpack_frame(bytes(forged), "f", expect_kind=codec.KIND_CHECKPOINT)
