"""Bytes <-> records: the ``.ckpt`` / ``run.meta`` file format of DESIGN §3.

A file is a 26-byte header and a body::

    magic "AFK1" | kind u8 | flags u8 | base_seq u64 | body_len u64 | crc32 u32 | body

All integers little-endian. The crc32 covers the header fields before it and
the body, so every single-byte flip and every truncation is caught before
anything is decompressed. The body is a zstd frame (content size and content
checksum set) of the record's msgpack bytes. With flag bit 0 set, the frame is
a *delta*: it was compressed with the decoded bytes of checkpoint ``base_seq``
as a raw-content dictionary. With flag bit 1 set (a keyed store, see
``integrity.py``), a 32-byte HMAC-SHA256 follows the body; the crc and
``body_len`` do not cover it.
"""

from __future__ import annotations

import functools
import math
import re
import struct
import threading
import zlib
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

import msgspec
import zstandard

from afk_local.errors import CheckpointCorruptionError, SchemaVersionError
from afk_local.storage import migrate
from afk_local.storage.integrity import MAC_SIZE, Signer
from afk_local.storage.records import SCHEMA_VERSION, Checkpoint, RunMeta

MAGIC = b"AFK1"
KIND_CHECKPOINT = 1
KIND_META = 2
FLAG_DELTA = 0x01
FLAG_SIGNED = 0x02
"""Flag bit 1: a 32-byte HMAC-SHA256 trailer follows the body (a keyed store)."""
_KNOWN_FLAGS = FLAG_DELTA | FLAG_SIGNED

UNSIGNED_REASON = "unsigned record in a keyed store"

_HEADER = struct.Struct("<4sBBQQI")
HEADER_SIZE = _HEADER.size
_CRC_COVERED = HEADER_SIZE - 4  # every header byte before the crc field

DEFAULT_MAX_RECORD_BYTES = 1 << 30
"""Largest decoded record a reader accepts (1 GiB)."""

DEFAULT_LEVEL = 3
MAX_DELTA_BASE_BYTES = 64 << 20
"""Bases above this are not used as dictionaries: the match tables would cost
more memory than the delta saves. Such checkpoints are written as keyframes."""

_MAX_WINDOW_SIZE = 1 << 28  # enough for a 64 MiB base plus a record of the same size

EncHook = Callable[[Any], Any]
DecHook = Callable[[type, Any], Any]

_T = TypeVar("_T")


class FrameHeader(NamedTuple):
    """The parsed, crc-checked header of a file."""

    kind: int
    flags: int
    base_seq: int
    body_len: int
    mac: bytes | None = None
    """The HMAC trailer of a signed file (not checked here), None when unsigned."""

    @property
    def is_delta(self) -> bool:
        """True when the body must be decoded against checkpoint ``base_seq``."""
        return bool(self.flags & FLAG_DELTA)


def pack_frame(
    kind: int, body: bytes, *, flags: int = 0, base_seq: int = 0, mac: bytes | None = None
) -> bytes:
    """Frame ``body`` with the header and crc of DESIGN §3, and ``mac`` as a signed trailer."""
    if mac is not None:
        if len(mac) != MAC_SIZE:
            raise ValueError(f"a MAC is {MAC_SIZE} bytes, not {len(mac)}")
        flags |= FLAG_SIGNED
    head = _HEADER.pack(MAGIC, kind, flags, base_seq, len(body), 0)[:_CRC_COVERED]
    crc = zlib.crc32(body, zlib.crc32(head))
    frame = head + struct.pack("<I", crc) + body
    return frame if mac is None else frame + mac


def unpack_frame(data: bytes, path: str, *, expect_kind: int) -> tuple[FrameHeader, bytes]:
    """Check magic, kind, length and crc; return the header and the body.

    Raises:
        CheckpointCorruptionError: naming ``path`` and what is wrong.
    """
    if len(data) < HEADER_SIZE:
        raise CheckpointCorruptionError(path, f"{len(data)} bytes, shorter than the header")
    magic, kind, flags, base_seq, body_len, crc = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CheckpointCorruptionError(path, f"bad magic {magic!r}")
    trailer = MAC_SIZE if flags & FLAG_SIGNED else 0
    if len(data) - HEADER_SIZE - trailer != body_len:
        raise CheckpointCorruptionError(
            path,
            f"body is {len(data) - HEADER_SIZE - trailer} bytes, header says {body_len}"
            + (" (plus a signature)" if trailer else ""),
        )
    if trailer:
        body, mac = data[HEADER_SIZE:-trailer], data[-trailer:]
    else:
        body, mac = data[HEADER_SIZE:], None
    if zlib.crc32(body, zlib.crc32(data[:_CRC_COVERED])) != crc:
        raise CheckpointCorruptionError(path, "crc32 mismatch")
    if kind != expect_kind:
        raise CheckpointCorruptionError(path, f"kind {kind}, expected {expect_kind}")
    if flags & ~_KNOWN_FLAGS:
        raise CheckpointCorruptionError(path, f"unknown flags {flags:#x}")
    if bool(flags & FLAG_DELTA) != (base_seq != 0):
        raise CheckpointCorruptionError(path, "delta flag and base_seq disagree")
    return FrameHeader(kind, flags, base_seq, body_len, mac), body


def signature_offset(head: bytes, size: int) -> int | None:
    """Where the MAC trailer of a file starts, judging by its header and size alone.

    None when ``head`` (the file's first :data:`HEADER_SIZE` bytes) is not a sound
    signed header for a file of ``size`` bytes. Nothing is checked beyond that: it
    lets a reader fetch a predecessor's MAC for the chain without reading the file.
    """
    if len(head) < HEADER_SIZE:
        return None
    magic, _, flags, _, body_len, _ = _HEADER.unpack_from(head)
    if magic != MAGIC or not flags & FLAG_SIGNED or size != HEADER_SIZE + body_len + MAC_SIZE:
        return None
    return size - MAC_SIZE


def _dictionary(base: bytes) -> zstandard.ZstdCompressionDict:
    return zstandard.ZstdCompressionDict(base, dict_type=zstandard.DICT_TYPE_RAWCONTENT)


_local = threading.local()


def _keyframe_compressor(level: int) -> zstandard.ZstdCompressor:
    # Creating a compression context costs more than compressing 10 KB: keep one
    # per thread and level (contexts are not thread-safe).
    cache: dict[int, zstandard.ZstdCompressor] | None = getattr(_local, "compressors", None)
    if cache is None:
        cache = _local.compressors = {}
    compressor = cache.get(level)
    if compressor is None:
        compressor = cache[level] = zstandard.ZstdCompressor(
            level=level, write_content_size=True, write_checksum=True
        )
    return compressor


def compress(raw: bytes, base: bytes | None = None, *, level: int = DEFAULT_LEVEL) -> bytes:
    """One zstd frame of ``raw`` (content size and checksum set), against ``base`` if given.

    The match tables are sized from the base: widened for a base over ~1 MB so
    that zstd sees the whole dictionary (otherwise deltas of large snapshots
    silently degrade to full size), and kept small for a small base, where
    initialising the level's default tables would cost more than compressing.
    """
    if base is None:
        return _keyframe_compressor(level).compress(raw)
    return zstandard.ZstdCompressor(
        dict_data=_dictionary(base), compression_params=delta_parameters(level, len(base), len(raw))
    ).compress(raw)


def _size_tier(size: int) -> int:
    # zstd picks a level's search parameters from one of four source-size tables
    # (<= 16 KiB, <= 128 KiB, <= 256 KiB, larger): any size of a tier gives the same ones.
    for bound in (16 << 10, 128 << 10, 256 << 10):
        if size <= bound:
            return bound
    return 1 << 30


@functools.lru_cache(maxsize=256)
def _tier_parameters(
    level: int, tier: int, window_log: int, table_log: int
) -> zstandard.ZstdCompressionParameters:
    return zstandard.ZstdCompressionParameters.from_level(
        level,
        source_size=tier,
        window_log=window_log,
        hash_log=table_log,
        chain_log=table_log,
        write_content_size=1,
        write_checksum=1,
    )


def delta_parameters(
    level: int, base_size: int, raw_size: int
) -> zstandard.ZstdCompressionParameters:
    """The zstd parameters :func:`compress` uses for a delta of ``raw_size`` bytes against
    a base of ``base_size`` bytes.

    Cached (the same object for the same sizes' window, table and size tier), since
    building them costs as much as compressing a small delta, and the checkpoints
    of one run repeat a handful of them.
    """
    window_log = max(10, min(30, (base_size + raw_size).bit_length()))
    table_log = max(6, min(28, math.ceil(math.log2(max(base_size, 64) / 8))))
    return _tier_parameters(level, _size_tier(raw_size), window_log, table_log)


def check_content_size(body: bytes, path: str, max_bytes: int) -> int:
    """The decoded size a zstd frame declares; refuses a missing size or one over ``max_bytes``."""
    try:
        declared = zstandard.frame_content_size(body)
    except zstandard.ZstdError as exc:
        raise CheckpointCorruptionError(path, f"bad zstd frame header: {exc}") from None
    if declared < 0:
        raise CheckpointCorruptionError(path, "zstd frame does not declare its content size")
    if declared > max_bytes:
        raise CheckpointCorruptionError(
            path, f"declares {declared} decoded bytes, over max_record_bytes={max_bytes}"
        )
    return int(declared)


def decompress_chain(bodies: list[bytes], paths: list[str]) -> bytes:
    """Decode a keyframe and the deltas chained on it; returns the last record's bytes.

    Every frame's declared size must already have passed :func:`check_content_size`.
    """
    try:
        return zstandard.ZstdDecompressor(
            max_window_size=_MAX_WINDOW_SIZE
        ).decompress_content_dict_chain(list[bytes | bytearray | memoryview](bodies))
    except zstandard.ZstdError as exc:
        match = re.search(r"chunk (\d+)", str(exc))
        index = int(match.group(1)) if match else len(paths) - 1
        path = paths[min(max(index, 0), len(paths) - 1)]
        raise CheckpointCorruptionError(path, f"zstd: {exc}") from None


def decompress(body: bytes, path: str, *, base: bytes | None, max_bytes: int) -> bytes:
    """Decode one zstd frame, refusing declared sizes over ``max_bytes`` before allocating."""
    declared = check_content_size(body, path, max_bytes)
    try:
        if base is None:
            dctx = zstandard.ZstdDecompressor(max_window_size=_MAX_WINDOW_SIZE)
        else:
            dctx = zstandard.ZstdDecompressor(
                dict_data=_dictionary(base), max_window_size=_MAX_WINDOW_SIZE
            )
        raw = dctx.decompress(body, max_output_size=max(declared, 1))
    except zstandard.ZstdError as exc:
        raise CheckpointCorruptionError(path, f"zstd: {exc}") from None
    if len(raw) != declared:
        raise CheckpointCorruptionError(path, f"decoded {len(raw)} bytes, declared {declared}")
    return raw


class RecordCodec:
    """msgpack encoding of records, with optional hooks for custom payload types.

    A codec with a ``signer`` belongs to a keyed store: everything that encodes
    or decodes files through it signs them and checks their signatures, so the
    key travels wherever the store's codec already goes.
    """

    def __init__(
        self,
        *,
        enc_hook: EncHook | None = None,
        dec_hook: DecHook | None = None,
        signer: Signer | None = None,
    ):
        self.signer = signer
        """The key of a keyed store (None: unsigned files, signatures not checked)."""
        self._encoder = msgspec.msgpack.Encoder(enc_hook=enc_hook)
        self._checkpoint = msgspec.msgpack.Decoder(Checkpoint, dec_hook=dec_hook)
        self._meta = msgspec.msgpack.Decoder(RunMeta, dec_hook=dec_hook)

    def encode(self, record: Any) -> bytes:
        """msgpack bytes of a record (or any msgpack-able value)."""
        return self._encoder.encode(record)

    @property
    def enc_hook(self) -> EncHook | None:
        """The hook that encodes custom payload types (None: msgpack types only)."""
        return self._encoder.enc_hook

    def decode_checkpoint(self, raw: bytes, path: str) -> Checkpoint:
        """Validate and decode a checkpoint record, migrating older schemas."""
        return self._decode(self._checkpoint, Checkpoint, raw, path)

    def decode_meta(self, raw: bytes, path: str) -> RunMeta:
        """Validate and decode a run.meta record, migrating older schemas."""
        return self._decode(self._meta, RunMeta, raw, path)

    def _decode(
        self, decoder: msgspec.msgpack.Decoder[_T], cls: type[_T], raw: bytes, path: str
    ) -> _T:
        try:
            record = decoder.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            # Not necessarily damage (the crc passed): maybe an older schema.
            try:
                return migrate.upgrade(cls, msgspec.msgpack.decode(raw), path)
            except (msgspec.DecodeError, msgspec.ValidationError):
                raise CheckpointCorruptionError(path, f"record does not decode: {exc}") from None
        version = record.schema_version  # type: ignore[attr-defined]
        if version > SCHEMA_VERSION:
            raise SchemaVersionError(path, version, SCHEMA_VERSION)
        if version < SCHEMA_VERSION:
            return migrate.upgrade(cls, msgspec.msgpack.decode(raw), path)
        return record


def encode_meta(codec: RecordCodec, meta: RunMeta, *, level: int = DEFAULT_LEVEL) -> bytes:
    """The complete bytes of a ``run.meta`` file (signed for ``meta.run_id`` in a keyed store)."""
    raw = codec.encode(meta)
    mac = None if codec.signer is None else codec.signer.meta_mac(meta.run_id, raw)
    return pack_frame(KIND_META, compress(raw, level=level), mac=mac)


def decode_meta(
    codec: RecordCodec,
    data: bytes,
    path: str,
    *,
    max_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    run_id: str | None = None,
) -> RunMeta:
    """Check and decode the bytes of a ``run.meta`` file.

    A keyed codec also checks the signature against ``run_id`` (the run the file
    was found in; default: the run id the record names), so a meta copied from
    another run is refused.
    """
    header, body = unpack_frame(data, path, expect_kind=KIND_META)
    raw = decompress(body, path, base=None, max_bytes=max_bytes)
    if codec.signer is not None:
        if header.mac is None:
            raise CheckpointCorruptionError(path, UNSIGNED_REASON)
        owner = run_id if run_id is not None else codec.decode_meta(raw, path).run_id
        if not codec.signer.matches(codec.signer.meta_mac(owner, raw), header.mac):
            raise CheckpointCorruptionError(
                path,
                "HMAC mismatch: edited, copied from another run, or signed with another key",
            )
    return codec.decode_meta(raw, path)
