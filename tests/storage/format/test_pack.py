"""The pack file format: round trips, damage detection, bounds on what is read from disk."""

from __future__ import annotations

import contextlib
import struct
import zlib
from pathlib import Path

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from afk_local.errors import CheckpointCorruptionError
from afk_local.storage.format import codec
from afk_local.storage.format.integrity import Signer
from afk_local.storage.format.layout import parse_pack_name
from afk_local.storage.format.pack import (
    BLOCK_TARGET_BYTES,
    HEADER_SIZE,
    BlockCache,
    PackEntry,
    PackReader,
    encode_pack,
    read_pack_index,
    verify_pack,
)

SIGNER = Signer("pack test key")


def _image(seq: int, body: bytes, *, delta: bool = False) -> bytes:
    flags = codec.FLAG_DELTA if delta and seq > 1 else 0
    base = seq - 1 if flags else 0
    return codec.pack_frame(codec.KIND_CHECKPOINT, body, flags=flags, base_seq=base)


def _entries(bodies: list[bytes], first: int = 1, gap: int = 1) -> list[PackEntry]:
    phases = ("runtime_state", "step_started", "langgraph")
    return [
        PackEntry(first + i * gap, phases[i % 3], _image(first + i * gap, b, delta=i % 4 != 0))
        for i, b in enumerate(bodies)
    ]


def _write(tmp: Path, entries: list[PackEntry], signer: Signer | None = None) -> Path:
    name, data = encode_pack(entries, run_id="r", signer=signer)
    path = tmp / name
    path.write_bytes(data)
    return path


def _read_all(path: Path, signer: Signer | None = None) -> list[PackEntry]:
    index = read_pack_index(str(path), signer=signer, owners=("r",))
    problems = verify_pack(index)
    if problems:
        raise CheckpointCorruptionError(str(path), "; ".join(problems))
    reader = PackReader(index)
    return [PackEntry(s, index.phase(i), reader.image(i)) for i, s in enumerate(index.seqs)]


bodies = st.lists(st.binary(min_size=0, max_size=300), min_size=1, max_size=40)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(bodies, st.integers(1, 10**6), st.integers(1, 5), st.booleans())
def test_round_trip(tmp_path: Path, found: list[bytes], first: int, gap: int, keyed: bool) -> None:
    entries = _entries(found, first, gap)
    signer = SIGNER if keyed else None
    path = _write(tmp_path, entries, signer)
    parsed = parse_pack_name(path.name)
    assert parsed is not None
    assert (parsed.first, parsed.last) == (entries[0].seq, entries[-1].seq)
    assert _read_all(path, signer) == entries
    index = read_pack_index(str(path), signer=signer, owners=("r",))
    assert index.find(entries[0].seq + gap * len(entries)) is None
    path.unlink()


def test_many_entries_span_blocks_and_each_is_found(tmp_path: Path) -> None:
    entries = _entries([bytes([i % 251]) * 900 for i in range(600)], first=5)
    path = _write(tmp_path, entries)
    index = read_pack_index(str(path))
    assert len(index.blocks) > 1  # about BLOCK_TARGET_BYTES of entries per block
    assert all(b.raw_size < BLOCK_TARGET_BYTES + 2000 for b in index.blocks)
    cache = BlockCache(max_bytes=2 * BLOCK_TARGET_BYTES + 4000)  # two blocks
    reader = PackReader(index, cache)
    for entry in reversed(entries):  # out of order: blocks evicted and read again
        at = index.find(entry.seq)
        assert at is not None and reader.image(at) == entry.image
        assert index.phase(at) == entry.phase
        assert 0 < cache.size <= cache.max_bytes


def _sample() -> list[PackEntry]:
    return _entries([bytes([i]) * (20 + 7 * i) for i in range(8)])


@pytest.mark.parametrize("keyed", [False, True])
def test_every_single_byte_flip_is_detected(tmp_path: Path, keyed: bool) -> None:
    signer = SIGNER if keyed else None
    entries = _sample()
    name, data = encode_pack(entries, run_id="r", signer=signer)
    path = tmp_path / name
    for at in range(len(data)):
        damaged = bytearray(data)
        damaged[at] ^= 0x01 if at % 2 else 0x80  # low and high bits, every byte
        path.write_bytes(bytes(damaged))
        with pytest.raises(CheckpointCorruptionError):
            _read_all(path, signer)


@pytest.mark.parametrize("keyed", [False, True])
def test_every_truncation_is_detected(tmp_path: Path, keyed: bool) -> None:
    signer = SIGNER if keyed else None
    name, data = encode_pack(_sample(), run_id="r", signer=signer)
    path = tmp_path / name
    for size in range(len(data)):
        path.write_bytes(data[:size])
        with pytest.raises(CheckpointCorruptionError):
            _read_all(path, signer)
    path.write_bytes(data + b"\x00")  # and a byte too many
    with pytest.raises(CheckpointCorruptionError):
        _read_all(path, signer)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.data())
def test_random_damage_is_detected_or_harmless(tmp_path: Path, data: st.DataObject) -> None:
    entries = _sample()
    name, blob = encode_pack(entries, run_id="r")
    damaged = bytearray(blob)
    for _ in range(data.draw(st.integers(1, 4))):
        damaged[data.draw(st.integers(0, len(blob) - 1))] = data.draw(st.integers(0, 255))
    path = tmp_path / name
    path.write_bytes(bytes(damaged))
    with contextlib.suppress(CheckpointCorruptionError):
        assert _read_all(path) == entries  # only if every byte was put back as it was


def test_a_signed_pack_is_bound_to_its_run_and_key(tmp_path: Path) -> None:
    path = _write(tmp_path, _sample(), SIGNER)
    read_pack_index(str(path), signer=SIGNER, owners=("other", "r"))  # e.g. a fork's ancestor
    with pytest.raises(CheckpointCorruptionError, match="HMAC mismatch"):
        read_pack_index(str(path), signer=SIGNER, owners=("other",))
    with pytest.raises(CheckpointCorruptionError, match="HMAC mismatch"):
        read_pack_index(str(path), signer=Signer("another key"), owners=("r",))
    unsigned = _write(tmp_path, _entries([b"x"] * 3, first=100))
    with pytest.raises(CheckpointCorruptionError, match="unsigned"):
        read_pack_index(str(unsigned), signer=SIGNER, owners=("r",))
    read_pack_index(str(path))  # a store without a key reads signed packs (crc checked)


def _forge(tmp_path: Path, entries: list[PackEntry], edit) -> Path:
    """A pack whose header and index were edited and whose crc was recomputed to match."""
    _, data = encode_pack(entries, run_id="r")
    head = bytearray(data[:HEADER_SIZE])
    fields = list(struct.unpack("<4sBBHQQIIQQI", head))
    index_at, index_len = fields[8], fields[9]
    raw = zstandard.ZstdDecompressor().decompress(data[index_at : index_at + index_len])
    fields, raw = edit(fields, bytearray(raw))
    index = zstandard.ZstdCompressor(write_content_size=True).compress(bytes(raw))
    fields[9] = len(index)
    head = struct.pack("<4sBBHQQIIQQI", *fields[:-1], 0)[:-4]
    crc = zlib.crc32(index, zlib.crc32(head))
    body = data[HEADER_SIZE:index_at]
    path = tmp_path / "forged.pack"
    path.write_bytes(head + struct.pack("<I", crc) + body + index)
    return path


def test_a_crafted_index_is_refused_with_bounded_work(tmp_path: Path) -> None:
    entries = _sample()

    def huge_count(fields, raw):
        fields[6] = 0xFFFFFFFF  # entries
        return fields, raw

    def more_blocks(fields, raw):
        fields[7] = fields[6]
        return fields, raw

    def lying_block(fields, raw):
        # the first block claims 1 GiB of raw bytes
        phases = struct.unpack_from("<I", raw)[0]
        at = 4
        for _ in range(phases):
            at += 1 + raw[at]
        struct.pack_into("<I", raw, at + 4, 1 << 30)
        return fields, raw

    def bad_phase(fields, raw):
        raw[-1] = 200
        return fields, raw

    def unordered(fields, raw):
        count = fields[6]
        at = len(raw) - 13 * count + 8 * 4  # the 5th and 6th seqs
        fifth, sixth = raw[at : at + 8], raw[at + 8 : at + 16]
        raw[at : at + 8], raw[at + 8 : at + 16] = sixth, fifth
        return fields, raw

    for edit in (huge_count, more_blocks, lying_block, bad_phase):
        path = _forge(tmp_path, entries, edit)
        with pytest.raises(CheckpointCorruptionError):
            read_pack_index(str(path))
    # Seqs out of order are refused when the index is read, not only by verify.
    with pytest.raises(CheckpointCorruptionError, match="do not rise strictly"):
        read_pack_index(str(_forge(tmp_path, entries, unordered)))


def test_encode_refuses_what_it_cannot_store() -> None:
    with pytest.raises(ValueError, match="rise"):
        encode_pack(_entries([b"a", b"b"], first=5, gap=1)[::-1], run_id="r")
    with pytest.raises(ValueError, match="1 to"):
        encode_pack([], run_id="r")
    with pytest.raises(ValueError, match="cannot be packed"):
        encode_pack([PackEntry(1, "runtime_state", b"short")], run_id="r")
    with pytest.raises(ValueError, match="invalid phase"):
        encode_pack([PackEntry(1, "Bad Phase", _image(1, b"x"))], run_id="r")


@pytest.mark.parametrize("seq", [0, 2, 1 << 63, (1 << 64) - 1])
def test_every_seq_is_range_checked_when_the_index_is_read(tmp_path: Path, seq: int) -> None:
    """Issue 33, finding 6: an index naming a seq outside its pack (crc recomputed)."""
    entries = _sample()  # seqs 1..8

    def out_of_range(fields, raw):
        count = fields[6]
        struct.pack_into("<Q", raw, len(raw) - 13 * count + 8 * 3, seq)
        return fields, raw

    with pytest.raises(CheckpointCorruptionError, match="do not rise strictly"):
        read_pack_index(str(_forge(tmp_path, entries, out_of_range)))


def test_the_header_must_agree_with_the_pack_name_and_its_counts(tmp_path: Path) -> None:
    path = _write(tmp_path, _entries([b"x"] * 3, first=100))  # pack-...100-...102-...
    named = parse_pack_name(path.name)
    assert named is not None
    wider = path.with_name(path.name.replace("000000000102", "000000000103"))
    path.rename(wider)
    with pytest.raises(CheckpointCorruptionError, match=r"its name says 100\.\.103"):
        read_pack_index(str(wider))

    def crowded(fields, raw):
        fields[5] = fields[4] + 1  # 8 entries cannot have seqs in 1..2
        return fields, raw

    with pytest.raises(CheckpointCorruptionError, match=r"8 entries cannot have seqs in 1\.\.2"):
        read_pack_index(str(_forge(tmp_path, _sample(), crowded)))


def test_a_declared_index_longer_than_its_counts_is_refused_unread(tmp_path: Path) -> None:
    """Issue 33, finding 7: a sparse 1 GiB file declaring an index of all of it (crc
    matching) is refused from its header; nothing of the index is read."""
    from attacks import sparse_index_pack  # noqa: PLC0415

    path = _write(tmp_path, _sample())
    sparse_index_pack(path)
    assert path.stat().st_size > 1 << 29
    with pytest.raises(CheckpointCorruptionError, match="its counts allow"):
        read_pack_index(str(path))


def test_the_block_cache_is_bounded_in_bytes(tmp_path: Path) -> None:
    entries = _entries([bytes([i % 251]) * 900 for i in range(600)])
    index = read_pack_index(str(_write(tmp_path, entries)))
    cache = BlockCache(max_bytes=BLOCK_TARGET_BYTES)  # less than two blocks
    readers = [PackReader(index, cache), PackReader(index, cache)]  # shared by readers
    for n, entry in enumerate(entries):
        at = index.find(entry.seq)
        assert at is not None and readers[n % 2].image(at) == entry.image
        assert cache.size <= cache.max_bytes
    small = BlockCache(max_bytes=1000)  # a block larger than the bound is read, not kept
    assert PackReader(index, small).image(0) == entries[0].image and small.size == 0
