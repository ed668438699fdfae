"""Bytes <-> records: the ``.ckpt`` / ``run.meta`` file format of docs/format.md.

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
import re
import struct
import threading
import zlib
from typing import Any, NamedTuple, TypeVar

import msgspec
import zstandard

from afk_local.errors import (
    CheckpointCorruptionError,
    IntOutOfRangeError,
    RecordTooDeepError,
    SchemaVersionError,
)
from afk_local.storage.format import migrate, prefix_zstd, values
from afk_local.storage.format.integrity import MAC_SIZE, Signer
from afk_local.storage.format.records import (
    MAX_NESTING_DEPTH,
    SCHEMA_VERSION,
    Checkpoint,
    Effect,
    RunMeta,
)

MAGIC = b"AFK1"
KIND_CHECKPOINT = 1
KIND_META = 2
KIND_MANIFEST = 3
FLAG_DELTA = 0x01
FLAG_SIGNED = 0x02
"""Flag bit 1: a 32-byte HMAC-SHA256 trailer follows the body (a keyed store)."""
_KNOWN_FLAGS = FLAG_DELTA | FLAG_SIGNED

UNSIGNED_REASON = "unsigned record in a keyed store"

_HEADER = struct.Struct("<4sBBQQI")
HEADER_SIZE = _HEADER.size
_CRC_COVERED = HEADER_SIZE - 4  # every header byte before the crc field
_COVERED = struct.Struct("<4sBBQQ")  # those bytes
_CRC = struct.Struct("<I")

DEFAULT_MAX_RECORD_BYTES = 256 << 20
"""Largest decoded record a store writes or reads (256 MiB; ``Store(max_record_bytes=...)``
or ``$AFK_LOCAL_MAX_RECORD_BYTES`` change it). Decompressing a record allocates its
declared size once, so a crafted frame (a "zstd bomb") costs at most this much."""


DEFAULT_LEVEL = 3
"""zstd level of keyframes (and of deltas, above it)."""

FAST_DELTA_LEVEL = 1
"""zstd level of deltas when the store's level is :data:`DEFAULT_LEVEL` or below (a lower
level stays as it is): zstd's fast strategy, one hash table. A delta is almost all
matches against its base, which every strategy finds; the default level's double table
finds 1-3% fewer bytes and costs ~40% more CPU per delta, most of it in loading the
base (measured on a 9 KB state: benchmarks/bench_checkpoint_cpu.py)."""

MAX_DELTA_BASE_BYTES = 64 << 20
"""Bases above this are not used as dictionaries: the match tables would cost
more memory than the delta saves. Such checkpoints are written as keyframes, and
readers refuse a delta whose base declares more (no writer makes one), which keeps
decoding a delta within its bound plus 64 MiB."""

_MAX_WINDOW_SIZE = 1 << 28  # enough for a 64 MiB base plus a record of the same size

EncHook = values.EncHook
DecHook = values.DecHook

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
    """Frame ``body`` with the header and crc of docs/format.md, and ``mac`` as a signed trailer."""
    if mac is not None:
        if len(mac) != MAC_SIZE:
            raise ValueError(f"a MAC is {MAC_SIZE} bytes, not {len(mac)}")
        flags |= FLAG_SIGNED
    head = _COVERED.pack(MAGIC, kind, flags, base_seq, len(body))
    crc = _CRC.pack(zlib.crc32(body, zlib.crc32(head)))
    # One copy of the body, the frame's own: the body is most of a checkpoint's bytes.
    return b"".join((head, crc, body) if mac is None else (head, crc, body, mac))


def unpack_frame(data: bytes, path: str, *, expect_kind: int) -> tuple[FrameHeader, bytes]:
    """Check magic, kind, length and crc; return the header and the body.

    Raises:
        CheckpointCorruptionError: naming ``path`` and what is wrong.
    """
    header = _parse_layout(data, len(data), path)
    trailer = MAC_SIZE if header.flags & FLAG_SIGNED else 0
    if trailer:
        body, mac = data[HEADER_SIZE:-trailer], data[-trailer:]
    else:
        body, mac = data[HEADER_SIZE:], None
    _, _, _, _, _, crc = _HEADER.unpack_from(data)
    if zlib.crc32(body, zlib.crc32(data[:_CRC_COVERED])) != crc:
        raise CheckpointCorruptionError(path, "crc32 mismatch")
    _check_fields(header, path, expect_kind)
    return header._replace(mac=mac), body


PEEK_SIZE = HEADER_SIZE + 18
"""Bytes of a file :func:`peek_frame` needs: the header and a zstd frame header (at most 18)."""


def peek_frame(head: bytes, size: int, path: str, *, expect_kind: int) -> tuple[FrameHeader, int]:
    """The header of a file of ``size`` bytes and the decoded size its frame declares.

    ``head`` is the file's first :data:`PEEK_SIZE` bytes. Nothing is decompressed and
    the crc is not checked (that needs the whole body): this lets a reader follow a
    delta chain back to its keyframe, refusing it before reading any body in full.
    """
    header = _parse_layout(head, size, path)
    _check_fields(header, path, expect_kind)
    try:
        declared = zstandard.frame_content_size(head[HEADER_SIZE:])
    except zstandard.ZstdError as exc:
        raise CheckpointCorruptionError(path, f"bad zstd frame header: {exc}") from None
    if declared < 0:
        raise CheckpointCorruptionError(path, "zstd frame does not declare its content size")
    return header, int(declared)


def _parse_layout(data: bytes, size: int, path: str) -> FrameHeader:
    """Magic and lengths of a file of ``size`` bytes whose first bytes are ``data``."""
    if size < HEADER_SIZE or len(data) < HEADER_SIZE:
        raise CheckpointCorruptionError(path, f"{size} bytes, shorter than the header")
    magic, kind, flags, base_seq, body_len, _ = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CheckpointCorruptionError(path, f"bad magic {magic!r}")
    trailer = MAC_SIZE if flags & FLAG_SIGNED else 0
    if size - HEADER_SIZE - trailer != body_len:
        raise CheckpointCorruptionError(
            path,
            f"body is {size - HEADER_SIZE - trailer} bytes, header says {body_len}"
            + (" (plus a signature)" if trailer else ""),
        )
    return FrameHeader(kind, flags, base_seq, body_len)


def _check_fields(header: FrameHeader, path: str, expect_kind: int) -> None:
    if header.kind != expect_kind:
        raise CheckpointCorruptionError(path, f"kind {header.kind}, expected {expect_kind}")
    if header.flags & ~_KNOWN_FLAGS:
        raise CheckpointCorruptionError(path, f"unknown flags {header.flags:#x}")
    if bool(header.flags & FLAG_DELTA) != (header.base_seq != 0):
        raise CheckpointCorruptionError(path, "delta flag and base_seq disagree")


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
    parameters = delta_parameters(level, len(base), len(raw))
    reused = prefix_zstd.prefix_compressor() if len(base) <= prefix_zstd.MAX_BASE_BYTES else None
    if reused is not None:
        return reused.compress(raw, base, parameters)
    return zstandard.ZstdCompressor(
        dict_data=_dictionary(base), compression_params=parameters
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
    # ceil(log2(base_size / 8)), in integers (this runs for every delta)
    table_log = max(6, min(28, (max(base_size, 64) - 1).bit_length() - 3))
    search = min(level, FAST_DELTA_LEVEL) if level <= DEFAULT_LEVEL else level
    return _tier_parameters(search, _size_tier(raw_size), window_log, table_log)


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


_CONTAINER_HEADS = bytes(range(0x80, 0xA0)) + b"\xdc\xdd\xde\xdf"
_NOT_CONTAINER_HEAD = bytes(b for b in range(256) if b not in _CONTAINER_HEADS)
_ARRAY_OF_RAW = msgspec.msgpack.Decoder(list[msgspec.Raw])
_MAP_OF_RAW = msgspec.msgpack.Decoder(dict[str, msgspec.Raw])
# Bytes after a msgpack head byte before the next value: fixed-size scalars, then
# the size fields of str/bin/ext (their payload follows) and of arrays/maps.
_FIXED = {0xC0: 0, 0xC2: 0, 0xC3: 0, 0xCC: 1, 0xD0: 1, 0xCD: 2, 0xD1: 2, 0xCA: 4, 0xCE: 4}
_FIXED.update({0xD2: 4, 0xCB: 8, 0xCF: 8, 0xD3: 8, 0xD4: 2, 0xD5: 3, 0xD6: 5, 0xD7: 9, 0xD8: 17})
_SIZED = {0xC4: (1, 0), 0xD9: (1, 0), 0xC5: (2, 0), 0xDA: (2, 0), 0xC6: (4, 0), 0xDB: (4, 0)}
_SIZED.update({0xC7: (1, 1), 0xC8: (2, 1), 0xC9: (4, 1)})  # ext: size, then a type byte
_COUNTED = {0xDC: (2, 1), 0xDD: (4, 1), 0xDE: (2, 2), 0xDF: (4, 2)}


def nesting_within(data: bytes, limit: int = MAX_NESTING_DEPTH) -> bool:
    """True when the msgpack value ``data`` nests lists and maps at most ``limit`` deep.

    Cheap for ordinary records: a value with no more container heads than ``limit``
    (counted at C speed) cannot nest deeper, so only subtrees that might are looked
    into, one level at a time.
    """
    if len(data) <= limit or len(data.translate(None, _NOT_CONTAINER_HEAD)) <= limit:
        return True
    head = data[0]
    if not (0x80 <= head <= 0x9F or 0xDC <= head <= 0xDF):
        return True  # a scalar (a long string, say): nothing nests in it
    if limit <= 0:
        return False
    try:
        is_map = head <= 0x8F or head >= 0xDE
        children = list(_MAP_OF_RAW.decode(data).values()) if is_map else _ARRAY_OF_RAW.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return _scan_nesting(data, limit)  # keys that are not strings, or too deep to skip
    return all(len(c) < limit or nesting_within(bytes(c), limit - 1) for c in children)


def _scan_nesting(data: bytes, limit: int) -> bool:
    """The exact, iterative form of :func:`nesting_within` (any keys, any depth)."""
    remaining = [1]  # values still to read at each open level
    pos, end = 0, len(data)
    while remaining:
        if remaining[-1] == 0:
            remaining.pop()
            continue
        remaining[-1] -= 1
        if pos >= end:
            return True  # truncated: not ours to judge here, the decoder refuses it
        b = data[pos]
        pos += 1
        count = 0
        if b <= 0x7F or b >= 0xE0:
            continue
        if b <= 0x8F:
            count = (b & 0x0F) * 2
        elif b <= 0x9F:
            count = b & 0x0F
        elif b <= 0xBF:
            pos += b & 0x1F
            continue
        elif b in _FIXED:
            pos += _FIXED[b]
            continue
        elif b in _SIZED:
            width, extra = _SIZED[b]
            pos += width + extra + int.from_bytes(data[pos : pos + width], "big")
            continue
        elif b in _COUNTED:
            width, per = _COUNTED[b]
            count = per * int.from_bytes(data[pos : pos + width], "big")
            pos += width
        else:
            return True  # 0xc1 (never used): the decoder refuses it
        remaining.append(count)
        if len(remaining) - 1 > limit:
            return False
    return True


class RecordCodec:
    """msgpack encoding of records, with typed values and optional hooks for custom types.

    User data in a record (a checkpoint's payload, a run's params, an effect's
    result) may hold the common Python types of :mod:`afk_local.storage.format.values`;
    anything else goes through ``enc_hook``/``dec_hook`` (msgspec's convention).

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
        self._enc_hook = enc_hook
        self.ext_hook = values.ext_decoder(
            dec_hook, hooked_as_data=enc_hook is not None and dec_hook is None
        )
        """The decoders' ``ext_hook``: turns stored typed values back into objects."""
        self.hash_hook = values.hash_hook(enc_hook)
        """The ``enc_hook`` input and result hashes use (see :func:`values.hash_hook`)."""
        self._encoder = msgspec.msgpack.Encoder()
        self._checkpoint = msgspec.msgpack.Decoder(
            Checkpoint, dec_hook=dec_hook, ext_hook=self.ext_hook
        )
        self._meta = msgspec.msgpack.Decoder(RunMeta, dec_hook=dec_hook, ext_hook=self.ext_hook)
        self._value = msgspec.msgpack.Decoder(ext_hook=self.ext_hook)

    def encode(self, record: Any, *, enc_hook: EncHook | None = None) -> bytes:
        """msgpack bytes of a record (or of a payload value).

        Raises:
            UnstorableValueError: a value in it has a type nothing can store.
            RecordTooDeepError: it nests deeper than :data:`MAX_NESTING_DEPTH`, so a
                reader might not decode it: refused before anything is written.
        """
        tagged = self.tag(record, enc_hook or self._enc_hook)  # bounds the user data's depth
        try:
            raw = self._encoder.encode(tagged)
        except RecursionError:
            raise RecordTooDeepError("(the record)", MAX_NESTING_DEPTH) from None
        except OverflowError:  # an int msgpack cannot hold: say where it is
            raise _int_out_of_range(record) from None
        # tag() walked the user data (a payload, a result, any plain value) and bounded its
        # depth; run.meta also holds data it does not walk (extra, the pause prompt).
        if isinstance(record, RunMeta) and not nesting_within(raw):
            raise RecordTooDeepError(f"(a {type(record).__name__})", MAX_NESTING_DEPTH)
        return raw

    @staticmethod
    def tag(record: Any, enc_hook: EncHook | None = None) -> Any:
        """``record`` with the typed values in its user data made storable (see :mod:`.values`)."""
        if isinstance(record, Checkpoint):
            payload = values.tag(record.payload, enc_hook)
            if payload is record.payload:
                return record
            return msgspec.structs.replace(record, payload=payload)
        if isinstance(record, Effect):
            result = values.tag(record.result, enc_hook, (None, "result"))
            if result is record.result:
                return record
            return msgspec.structs.replace(record, result=result)
        if isinstance(record, RunMeta):
            params = values.tag(record.params, enc_hook)
            if params is record.params:
                return record
            return msgspec.structs.replace(record, params=params)
        return values.tag(record, enc_hook)

    def decode_value(self, raw: bytes) -> Any:
        """A payload value from msgpack bytes, typed values rebuilt."""
        return self._value.decode(raw)

    @property
    def enc_hook(self) -> EncHook | None:
        """The user's hook for custom payload types (None: msgpack and the common types only)."""
        return self._enc_hook

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
            try:
                record = decoder.decode(raw)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                # Not necessarily damage (the crc passed): maybe an older or newer schema.
                # Look at the version alone first: decoding a crafted record untyped could
                # build far more objects than its bytes (a list of a million empty lists).
                version = _schema_version(raw)
                if version is None or version == SCHEMA_VERSION:
                    raise CheckpointCorruptionError(
                        path, f"record does not decode: {exc}"
                    ) from None
                if version > SCHEMA_VERSION:
                    raise SchemaVersionError(path, version, SCHEMA_VERSION) from None
                try:
                    return migrate.upgrade(cls, msgspec.msgpack.decode(raw), path)
                except (msgspec.DecodeError, msgspec.ValidationError):
                    raise CheckpointCorruptionError(
                        path, f"record does not decode: {exc}"
                    ) from None
            version = record.schema_version  # type: ignore[attr-defined]
            if version > SCHEMA_VERSION:
                raise SchemaVersionError(path, version, SCHEMA_VERSION)
            if version < SCHEMA_VERSION:
                return migrate.upgrade(cls, msgspec.msgpack.decode(raw), path)
            return record
        except RecursionError:
            raise CheckpointCorruptionError(
                path, f"record nests deeper than Python can decode (over {MAX_NESTING_DEPTH})"
            ) from None


class _Versioned(msgspec.Struct):
    schema_version: int = 1


_VERSION_ONLY = msgspec.msgpack.Decoder(_Versioned)


def _schema_version(raw: bytes) -> int | None:
    """The ``schema_version`` of a record's map, skipping every other field; None if none."""
    try:
        return _VERSION_ONLY.decode(raw).schema_version
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None


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


def _int_out_of_range(record: Any) -> IntOutOfRangeError:
    """Where in ``record`` the int an encoder could not hold is (its user data first)."""
    if isinstance(record, Checkpoint):
        found = values.int_out_of_range(record.payload)
    elif isinstance(record, Effect):
        found = values.int_out_of_range(record.result, (None, "result"))
    else:
        found = values.int_out_of_range(record)
    return found if found is not None else IntOutOfRangeError("(the record)", "an int")
