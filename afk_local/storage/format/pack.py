"""Pack files: many checkpoints of one run in one file (the format; docs/format.md, "Packs").

One file per checkpoint is right for publishing (a rename is atomic) and wrong for
keeping: a long run leaves thousands of small files. A pack folds older checkpoint
files into one, as git packs its loose objects::

    header   magic "AFKP" | version u8 | flags u8 | reserved u16 | first_seq u64 |
             last_seq u64 | entry_count u32 | block_count u32 | index_offset u64 |
             index_len u64 | crc32 u32                                  (52 bytes)
    blocks   zstd frames back to back, from byte 52 to index_offset
    index    one zstd frame (index_len bytes)
    mac      32 bytes HMAC-SHA256, only with flags bit 1 (a keyed store)

Each entry is the exact bytes its loose file had (an AFK1 checkpoint frame with its
own crc, delta base and MAC), so a packed checkpoint decodes, chains and verifies as
it did loose. Entries are concatenated in seq order and cut into blocks of about
:data:`BLOCK_TARGET_BYTES`; each block is one zstd frame, so reading one checkpoint
decompresses one block. The decompressed index is::

    phase_count u32, then per phase: length u8 + name
    per block:  size u32 | raw_size u32 | crc32 of its zstd bytes u32 | entry_count u32
    seq u64 per entry, then length u32 per entry, then phase number u8 per entry

Entries fill their block's raw bytes exactly and in order, so offsets are implied.
The header crc covers the header's first 48 bytes and the index bytes; each block's
crc (in the index) covers that block. In a keyed store the MAC covers the run id and
the SHA-256 of the header's first 48 bytes and the index: it pins which checkpoints
the pack holds and every block's crc, while each entry's own record MAC vouches for
its content. Everything read from disk is bounded and checked before use.
"""

from __future__ import annotations

import array
import bisect
import errno
import hashlib
import itertools
import operator
import os
import stat
import struct
import sys
import zlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import zstandard

from afk_local.errors import CheckpointCorruptionError
from afk_local.storage.format import codec
from afk_local.storage.format.integrity import MAC_SIZE, Signer
from afk_local.storage.format.layout import MAX_SEQ, pack_name, parse_pack_name, validate_phase

PACK_MAGIC = b"AFKP"
PACK_VERSION = 1
FLAG_SIGNED = 0x02
"""Flag bit 1: a 32-byte HMAC-SHA256 trailer follows the index (a keyed store)."""

_HEADER = struct.Struct("<4sBBHQQIIQQI")
HEADER_SIZE = _HEADER.size
_CRC_COVERED = HEADER_SIZE - 4
_BLOCK = struct.Struct("<IIII")

BLOCK_TARGET_BYTES = 128 << 10
"""Raw bytes a block is filled to before the next one starts (a read decompresses one)."""
MAX_ENTRY_BYTES = 64 << 20
"""Larger checkpoint files are never packed (they stay loose)."""
MAX_PACK_INPUT_BYTES = 256 << 20
"""Raw entry bytes a packer puts into one pack before it starts another."""
MAX_PACK_ENTRIES = 1 << 20
"""Entries one pack may hold."""
MAX_PACK_BYTES = 1 << 30
"""Largest pack file a reader accepts."""
_MAX_BLOCK_RAW = MAX_ENTRY_BYTES + BLOCK_TARGET_BYTES
_MAX_PHASES = 255
_MAX_PHASE_NAME = 32
BLOCK_CACHE_BYTES = 8 << 20
"""Decoded block bytes one :class:`BlockCache` keeps (a run reader's; 64 blocks of the
usual 128 KiB). A block larger than this is decoded for its read and not kept."""
_LEVEL = 1
# A pack's entries are zstd frames already, so its blocks gain little from a slower
# level: 256 deltas of a 9 KB state (87,194 B) make a pack of 81,558 B at level 3 and
# 81,690 B at level 1, in half the time (1.3 ms against 0.6). Readers need no level.

_BIG_ENDIAN = sys.byteorder == "big"
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


class PackEntry(NamedTuple):
    """One checkpoint to pack: its seq, phase and the exact bytes of its file."""

    seq: int
    phase: str
    image: bytes


class _Block(NamedTuple):
    offset: int
    size: int
    raw_size: int
    crc: int
    first_entry: int
    entry_count: int


def encode_pack(
    entries: Sequence[PackEntry],
    *,
    run_id: str,
    signer: Signer | None = None,
    level: int = _LEVEL,
) -> tuple[str, bytes]:
    """The file name and bytes of a pack holding ``entries`` (seq order, strictly rising).

    Signed with ``signer`` for ``run_id`` when given. Each image must be a checkpoint
    file's bytes of at most :data:`MAX_ENTRY_BYTES`.
    """
    if not entries or len(entries) > MAX_PACK_ENTRIES:
        raise ValueError(f"a pack holds 1 to {MAX_PACK_ENTRIES} entries, not {len(entries)}")
    phases: dict[str, int] = {}
    seqs = array.array("Q")
    lengths = array.array("I")
    phase_ids = bytearray()
    blocks: list[bytes] = []
    table: list[bytes] = []
    pending: list[bytes] = []
    pending_size = 0
    pending_count = 0
    compressor = zstandard.ZstdCompressor(level=level, write_content_size=True, write_checksum=True)

    def cut() -> None:
        nonlocal pending_size, pending_count
        raw = b"".join(pending)
        frame = compressor.compress(raw)
        blocks.append(frame)
        table.append(_BLOCK.pack(len(frame), len(raw), zlib.crc32(frame), pending_count))
        pending.clear()
        pending_size = pending_count = 0

    previous = 0
    for entry in entries:
        if not previous < entry.seq <= MAX_SEQ:
            raise ValueError(f"pack entries must rise in seq: {entry.seq} after {previous}")
        if not codec.HEADER_SIZE <= len(entry.image) <= MAX_ENTRY_BYTES:
            raise ValueError(f"checkpoint {entry.seq} ({len(entry.image)} bytes) cannot be packed")
        previous = entry.seq
        phase = validate_phase(entry.phase)
        if phase not in phases:
            if len(phases) == _MAX_PHASES:
                raise ValueError(f"a pack holds at most {_MAX_PHASES} phases")
            phases[phase] = len(phases)
        seqs.append(entry.seq)
        lengths.append(len(entry.image))
        phase_ids.append(phases[phase])
        pending.append(entry.image)
        pending_size += len(entry.image)
        pending_count += 1
        if pending_size >= BLOCK_TARGET_BYTES:
            cut()
    if pending:
        cut()
    if _BIG_ENDIAN:  # pragma: no cover - the index is little-endian on every host
        seqs.byteswap()
        lengths.byteswap()
    phase_table = b"".join(bytes((len(p),)) + p.encode() for p in phases)
    index_raw = b"".join(
        (
            struct.pack("<I", len(phases)),
            phase_table,
            *table,
            seqs.tobytes(),
            lengths.tobytes(),
            bytes(phase_ids),
        )
    )
    index = compressor.compress(index_raw)
    body = b"".join(blocks)
    head = _HEADER.pack(
        PACK_MAGIC,
        PACK_VERSION,
        FLAG_SIGNED if signer is not None else 0,
        0,
        entries[0].seq,
        entries[-1].seq,
        len(entries),
        len(blocks),
        HEADER_SIZE + len(body),
        len(index),
        0,
    )[:_CRC_COVERED]
    crc = zlib.crc32(index, zlib.crc32(head))
    parts = [head, struct.pack("<I", crc), body, index]
    if signer is not None:
        parts.append(signer.pack_mac(run_id, _pack_digest(head, index)))
    data = b"".join(parts)
    return pack_name(entries[0].seq, entries[-1].seq, hashlib.sha256(data).hexdigest()), data


def _pack_digest(head: bytes, index: bytes) -> bytes:
    return hashlib.sha256(head + index).digest()


@dataclass(frozen=True)
class PackIndex:
    """The checked header and index of one pack file: which checkpoints it holds, where."""

    path: str
    first: int
    last: int
    phases: tuple[str, ...]
    seqs: array.array[int]
    lengths: array.array[int]
    phase_ids: bytes
    blocks: tuple[_Block, ...]
    signed: bool
    size: int

    def __len__(self) -> int:
        return len(self.seqs)

    def find(self, seq: int) -> int | None:
        """The entry number of checkpoint ``seq``, None when this pack does not hold it."""
        at = bisect.bisect_left(self.seqs, seq)
        return at if at < len(self.seqs) and self.seqs[at] == seq else None

    def phase(self, entry: int) -> str:
        """The phase of entry number ``entry``."""
        return self.phases[self.phase_ids[entry]]

    def block_of(self, entry: int) -> tuple[_Block, int]:
        """The block holding entry ``entry`` and the entry's offset in its raw bytes."""
        number = bisect.bisect_right(self.blocks, entry, key=lambda b: b.first_entry) - 1
        block = self.blocks[number]
        return block, sum(self.lengths[block.first_entry : entry])


def _bad(path: str, reason: str) -> CheckpointCorruptionError:
    return CheckpointCorruptionError(path, reason)


def read_pack_index(
    path: str, *, signer: Signer | None = None, owners: Sequence[str] = ()
) -> PackIndex:
    """Open the pack at ``path`` and check its header and index (not its blocks).

    With ``signer`` (a keyed store) the pack must be signed for one of ``owners``
    (the run and the fork ancestors whose files it may share).

    Raises:
        CheckpointCorruptionError: naming the pack and what is wrong with it.
        FileNotFoundError: there is no such file (a concurrent repack removed it).
    """
    try:
        fd = _open_read(path)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise _bad(path, f"cannot read: {exc.strerror or exc}") from None
    try:
        size = os.fstat(fd).st_size
        head = os.pread(fd, HEADER_SIZE, 0)
        if len(head) < HEADER_SIZE:
            raise _bad(path, f"{size} bytes, shorter than a pack header")
        fields = _HEADER.unpack(head)
        magic, version, flags, reserved, first, last, count, block_count = fields[:8]
        index_at, index_len, crc = fields[8:]
        if magic != PACK_MAGIC:
            raise _bad(path, f"bad magic {magic!r}")
        trailer = MAC_SIZE if flags & FLAG_SIGNED else 0
        if size > MAX_PACK_BYTES:
            raise _bad(path, f"{size} bytes, over the {MAX_PACK_BYTES} a pack may have")
        if index_len > size or index_at != size - trailer - index_len or index_at < HEADER_SIZE:
            raise _bad(path, f"{size} bytes, which does not match the header (cut short?)")
        # Every length is bounded by what the counts allow before a byte is read: a
        # sparse file can be any size on disk for free.
        _check_counts(
            path,
            first=first,
            last=last,
            count=count,
            block_count=block_count,
            index_len=index_len,
            index_at=index_at,
        )
        index = os.pread(fd, index_len, index_at)
        mac = os.pread(fd, trailer, index_at + index_len) if trailer else b""
    except OSError as exc:
        raise _bad(path, f"cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(index) != index_len or len(mac) != trailer:
        raise CheckpointCorruptionError(path, "changed while it was read", moved=True)
    if zlib.crc32(index, zlib.crc32(head[:_CRC_COVERED])) != crc:
        raise _bad(path, "crc32 mismatch in the header or the index")
    if version != PACK_VERSION:
        raise _bad(path, f"pack version {version}, this afk_local reads {PACK_VERSION}: upgrade")
    if flags & ~FLAG_SIGNED or reserved:
        raise _bad(path, f"unknown flags {flags:#x}")
    if signer is not None:
        if not trailer:
            raise _bad(path, codec.UNSIGNED_REASON)
        digest = _pack_digest(head[:_CRC_COVERED], index)
        if not any(signer.matches(signer.pack_mac(o, digest), mac) for o in owners):
            raise _bad(path, "HMAC mismatch: edited, copied from another run, or another key")
    raw = _decode_index(path, index, count, block_count)
    phases, blocks, seqs, lengths, phase_ids = _parse_index(path, raw, count, block_count)
    _check_entries(path, first, last, seqs=seqs, lengths=lengths, blocks=blocks)
    if sum(b.size for b in blocks) != index_at - HEADER_SIZE:
        raise _bad(path, "blocks do not fill the space before the index")
    return PackIndex(
        path, first, last, phases, seqs, lengths, phase_ids, blocks, bool(trailer), size
    )


def _compress_bound(size: int) -> int:
    """The largest zstd frame ``size`` bytes compress to (ZSTD_COMPRESSBOUND, rounded up)."""
    return size + (size >> 8) + 1024


def _index_bound(count: int, block_count: int) -> int:
    """The largest decompressed index ``count`` entries in ``block_count`` blocks need."""
    return 4 + _MAX_PHASES * (1 + _MAX_PHASE_NAME) + _BLOCK.size * block_count + 13 * count


def _check_counts(
    path: str,
    *,
    first: int,
    last: int,
    count: int,
    block_count: int,
    index_len: int,
    index_at: int,
) -> None:
    """Refuse a header whose counts, seq range or lengths cannot be, before the index is read.

    The seq range must be the one the file is named after (when it has a pack's name)
    and hold ``count`` seqs; the index may be no longer than its counts compress to.
    """
    if not (1 <= count <= MAX_PACK_ENTRIES and 1 <= block_count <= count):
        raise _bad(path, f"{count} entries in {block_count} blocks")
    if not 1 <= first <= last <= MAX_SEQ:
        raise _bad(path, f"seq range {first}..{last}")
    if count > last - first + 1:
        raise _bad(path, f"{count} entries cannot have seqs in {first}..{last}")
    named = parse_pack_name(os.path.basename(path))
    if named is not None and (named.first, named.last) != (first, last):
        raise _bad(path, f"holds {first}..{last}, its name says {named.first}..{named.last}")
    bound = _compress_bound(_index_bound(count, block_count))
    if index_len > bound:
        raise _bad(path, f"index of {index_len} bytes, over the {bound} its counts allow")
    if index_at - HEADER_SIZE > block_count * _compress_bound(_MAX_BLOCK_RAW):
        raise _bad(path, f"{index_at - HEADER_SIZE} bytes of blocks, over what {block_count} hold")


def _check_entries(
    path: str,
    first: int,
    last: int,
    *,
    seqs: array.array[int],
    lengths: array.array[int],
    blocks: Sequence[_Block],
) -> None:
    """Every seq in the header's range and strictly rising, every length in bounds, every
    block filled exactly by its entries: a parsed index never hands out a seq, offset or
    size that the file's name and header do not allow."""
    if seqs[0] != first or seqs[-1] != last:
        raise _bad(path, f"holds {seqs[0]}..{seqs[-1]}, header says {first}..{last}")
    if not all(map(operator.lt, seqs, itertools.islice(seqs, 1, None))):
        raise _bad(path, "index seqs do not rise strictly")
    if min(lengths) < codec.HEADER_SIZE or max(lengths) > MAX_ENTRY_BYTES:
        raise _bad(path, "an entry's length is out of bounds")
    for block in blocks:
        start = block.first_entry
        if sum(lengths[start : start + block.entry_count]) != block.raw_size:
            raise _bad(path, f"block at byte {block.offset}: its entries do not fill it exactly")


def _open_read(path: str) -> int:
    """Open a pack for reading: never through a symlink, never blocking on a FIFO."""
    fd = os.open(path, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC | _O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        if _O_NONBLOCK:
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _decode_index(path: str, index: bytes, count: int, block_count: int) -> bytes:
    bound = _index_bound(count, block_count)
    try:
        declared = zstandard.frame_content_size(index)
    except zstandard.ZstdError as exc:
        raise _bad(path, f"bad index frame: {exc}") from None
    if not 0 <= declared <= bound:
        raise _bad(path, f"index declares {declared} bytes, over the {bound} its counts allow")
    try:
        raw = _decompressor(declared).decompress(index, max_output_size=max(declared, 1))
    except zstandard.ZstdError as exc:
        raise _bad(path, f"index: zstd: {exc}") from None
    if len(raw) != declared:
        raise _bad(path, f"index decoded to {len(raw)} bytes, declared {declared}")
    return raw


def _parse_index(
    path: str, raw: bytes, count: int, block_count: int
) -> tuple[tuple[str, ...], tuple[_Block, ...], array.array[int], array.array[int], bytes]:
    if len(raw) < 4:
        raise _bad(path, "index too short")
    (phase_count,) = struct.unpack_from("<I", raw, 0)
    if not 1 <= phase_count <= _MAX_PHASES:
        raise _bad(path, f"{phase_count} phases")
    at = 4
    phases = []
    for _ in range(phase_count):
        if at >= len(raw):
            raise _bad(path, "index too short for its phase table")
        length = raw[at]
        name = raw[at + 1 : at + 1 + length]
        at += 1 + length
        try:
            phases.append(validate_phase(name.decode("ascii")))
        except (UnicodeDecodeError, ValueError):
            raise _bad(path, f"bad phase name {name!r} in the index") from None
    if len(raw) - at != _BLOCK.size * block_count + 13 * count:
        raise _bad(path, "index size does not match its counts")
    blocks: list[_Block] = []
    offset, first_entry = HEADER_SIZE, 0
    for size, raw_size, crc, entry_count in _BLOCK.iter_unpack(
        raw[at : at + _BLOCK.size * block_count]
    ):
        if not (
            1 <= entry_count <= count - first_entry
            and 1 <= raw_size <= _MAX_BLOCK_RAW
            and 1 <= size <= _compress_bound(raw_size)
        ):
            raise _bad(path, f"block {len(blocks)} is out of bounds")
        blocks.append(_Block(offset, size, raw_size, crc, first_entry, entry_count))
        offset += size
        first_entry += entry_count
    if first_entry != count:
        raise _bad(path, f"blocks hold {first_entry} entries, the header says {count}")
    at += _BLOCK.size * block_count
    view = memoryview(raw)
    seqs, lengths = array.array("Q"), array.array("I")
    seqs.frombytes(view[at : at + 8 * count])
    at += 8 * count
    lengths.frombytes(view[at : at + 4 * count])
    at += 4 * count
    phase_ids = raw[at : at + count]
    if _BIG_ENDIAN:  # pragma: no cover
        seqs.byteswap()
        lengths.byteswap()
    if phase_ids.translate(None, bytes(range(phase_count))):
        raise _bad(path, "an entry names a phase the index does not have")
    return tuple(phases), tuple(blocks), seqs, lengths, phase_ids


class BlockCache:
    """Decoded blocks of packs, least recently used first out, bounded in bytes.

    One per run reader (its catalog), shared by the readers of all of its packs, so
    what a read keeps is :data:`BLOCK_CACHE_BYTES` however many packs it opens.
    Blocks are keyed by pack path, offset and crc: a pack re-read after it changed
    never hits a block of the old file.

    Args:
        max_bytes: decoded bytes kept; a larger block is returned but never kept.
    """

    def __init__(self, max_bytes: int = BLOCK_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._blocks: OrderedDict[tuple[str, int, int], bytes] = OrderedDict()
        self._bytes = 0

    @property
    def size(self) -> int:
        """Decoded bytes held now."""
        return self._bytes

    def get(self, path: str, block: _Block) -> bytes:
        """The decoded bytes of ``block`` of the pack at ``path``, from memory or disk.

        Raises:
            CheckpointCorruptionError: the block is damaged.
            FileNotFoundError: the pack is gone.
        """
        key = (path, block.offset, block.crc)
        raw = self._blocks.get(key)
        if raw is not None:
            self._blocks.move_to_end(key)
            return raw
        raw = read_block(path, block)
        if len(raw) <= self.max_bytes:
            self._blocks[key] = raw
            self._bytes += len(raw)
            while self._bytes > self.max_bytes:
                self._bytes -= len(self._blocks.popitem(last=False)[1])
        return raw

    def clear(self) -> None:
        """Drop every kept block."""
        self._blocks.clear()
        self._bytes = 0


class PackReader:
    """Reads entries of one checked pack through a byte-bounded :class:`BlockCache`.

    Args:
        index: the pack's checked index (:func:`read_pack_index`).
        cache: decoded blocks kept for later reads, shared with other packs' readers
            (a fresh one of :data:`BLOCK_CACHE_BYTES` when not given).
    """

    def __init__(self, index: PackIndex, cache: BlockCache | None = None) -> None:
        self.index = index
        self._cache = cache if cache is not None else BlockCache()
        self._starts = [b.first_entry for b in index.blocks]
        self._offsets: dict[int, list[int]] = {}

    def image(self, entry: int) -> bytes:
        """The exact file bytes of entry number ``entry``.

        Raises:
            CheckpointCorruptionError: its block is damaged.
            FileNotFoundError: the pack is gone (a concurrent repack removed it).
        """
        index = self.index
        number = bisect.bisect_right(self._starts, entry) - 1
        block = index.blocks[number]
        offsets = self._offsets.get(number)
        if offsets is None:  # where each entry of the block starts: summed once per block
            first = block.first_entry
            lengths = index.lengths[first : first + block.entry_count]
            offsets = self._offsets[number] = list(itertools.accumulate(lengths, initial=0))
        at = offsets[entry - block.first_entry]
        raw = self._cache.get(index.path, block)
        return raw[at : at + index.lengths[entry]]


def _decompressor(size: int) -> zstandard.ZstdDecompressor:
    """A decompressor whose window may be no larger than a frame of ``size`` bytes needs.

    An encoder never uses a window larger than its input (rounded up to a power of
    two), so this refuses nothing zstd wrote and bounds what a crafted frame allocates.
    """
    window = 1 << max(10, (max(size, 1) - 1).bit_length())
    return zstandard.ZstdDecompressor(max_window_size=window)


def read_block(path: str, block: _Block) -> bytes:
    """The decompressed bytes of one block, crc and size checked.

    Raises:
        CheckpointCorruptionError: the block is damaged.
        FileNotFoundError: the pack is gone.
    """
    try:
        fd = _open_read(path)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise _bad(path, f"cannot read: {exc.strerror or exc}") from None
    try:
        data = os.pread(fd, block.size, block.offset)
    except OSError as exc:
        raise _bad(path, f"cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    where = f"block at byte {block.offset}"
    if len(data) != block.size or zlib.crc32(data) != block.crc:
        raise _bad(path, f"{where}: crc32 mismatch")
    try:
        declared = zstandard.frame_content_size(data)
        if declared != block.raw_size:
            raise _bad(path, f"{where}: declares {declared} bytes, the index says {block.raw_size}")
        raw = _decompressor(block.raw_size).decompress(data, max_output_size=block.raw_size)
    except zstandard.ZstdError as exc:
        raise _bad(path, f"{where}: zstd: {exc}") from None
    if len(raw) != block.raw_size:
        raise _bad(path, f"{where}: decoded {len(raw)} bytes, expected {block.raw_size}")
    return raw


def verify_pack(index: PackIndex) -> list[str]:
    """Read back every block of a checked pack (one at a time, none kept). Returns the
    problems found (empty: sound).

    The order of its seqs and the size of every entry were checked when the index was
    read; the entries themselves (AFK1 frames) are checked when their checkpoints load.
    """
    problems = []
    for block in index.blocks:
        try:
            read_block(index.path, block)
        except CheckpointCorruptionError as exc:
            problems.append(exc.reason)
        except FileNotFoundError:
            problems.append("vanished while it was verified")
            break
    return problems


__all__ = [
    "BLOCK_CACHE_BYTES",
    "BLOCK_TARGET_BYTES",
    "FLAG_SIGNED",
    "HEADER_SIZE",
    "MAX_ENTRY_BYTES",
    "MAX_PACK_BYTES",
    "MAX_PACK_ENTRIES",
    "MAX_PACK_INPUT_BYTES",
    "PACK_MAGIC",
    "PACK_VERSION",
    "BlockCache",
    "PackEntry",
    "PackIndex",
    "PackReader",
    "encode_pack",
    "read_block",
    "read_pack_index",
    "verify_pack",
]
