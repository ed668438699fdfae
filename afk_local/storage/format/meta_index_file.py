"""The bytes of a store's ``runs.index`` (docs/format.md, "The meta index"): a run's
meta summary, the listing order in chunks, and the file that holds both. No policy:
:mod:`afk_local.storage.meta_index` decides what to trust and when to write.

Every decode here raises ValueError (msgspec's errors are ValueErrors too) for a file
or chunk that cannot be used; nothing in it is ever a path.
"""

from __future__ import annotations

import hashlib
import re
import struct
import zlib

import msgspec

from afk_local.errors import InvalidRunIdError
from afk_local.storage.format.frames import (
    FRAME_HEADER,
    FRAME_HEADER_SIZE,
    MAX_FRAME_BYTES,
    SIGNED_FRAME,
    encode_frame,
)
from afk_local.storage.format.integrity import MAC_SIZE, Signer
from afk_local.storage.format.layout import validate_run_id

UNREADABLE = ""
"""The status of a run whose ``run.meta`` could not be read (damaged, newer schema...)."""

CHUNK = 1024
"""Runs per chunk of the listing order."""

VERSION = 4
"""The file's version; a file of another is not used (and is rewritten)."""

_TAG = "afk-local/runs-index"

CHANGES_TAG = "afk-local/runs-changes"
"""What a keyed store's ``runs.changes`` records are signed as (a document MAC)."""

MAX_CHANGE_BYTES = 4096
"""The largest body of one ``runs.changes`` record (a run id and a summary need ~120)."""

Entry = tuple[int, str, int]
"""One run in the listing order: (created_ms, run id, directory inode), newest first."""

Stamp = tuple[int, int, int, int]
"""``runs/``'s (st_dev, st_ino, st_mtime_ns, st_ctime_ns)."""


class MetaSummary(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """What the index keeps of one run's ``run.meta``, and the stat it was read at.

    Only numbers, strings and a bool: it can hold no reference cycle, so it is never
    tracked by the garbage collector (``gc=False``), which a listing that decodes
    100,000 of them would otherwise run again and again."""

    ino: int
    mtime_ns: int
    size: int
    status: str
    """The run's status, or :data:`UNREADABLE`."""
    updated_ms: int
    entrypoint: bool
    """True when the run has an entrypoint (a watcher can resume it)."""
    next_attempt_ms: int
    created_ms: int
    """When the run was created (never changes for a run directory)."""
    dir_ino: int
    """The inode of the run's directory when its meta was read."""

    @property
    def expects_owner(self) -> bool:
        """True for ``created`` and ``running`` (see ``RunStatus.expects_owner``)."""
        return self.status in ("created", "running")


class Chunk(msgspec.Struct, array_like=True):
    """Part of the listing order: three lists of one length, newest created first."""

    run_ids: list[str]
    dir_inos: list[int]
    created_ms: list[int]


class IndexFile(msgspec.Struct):
    """The whole file."""

    version: int
    stamp: Stamp | None
    """``runs/``'s stamp just before the listing of it the order and ``unlisted`` come
    from, when that stamp may vouch for its names; else None."""
    unlisted: list[str]
    """Directories of that listing left out of the order (no meta yet, or unreadable)."""
    order: list[bytes]
    """The listing order: msgpack :class:`Chunk` s of at most :data:`CHUNK` runs."""
    runs: bytes
    """A msgpack ``dict[str, MetaSummary]``: decoded only when a summary is needed (held
    as bytes, so that reading the order skips it whole)."""
    deleted: tuple[int, int] | None = None
    """The (inode, mtime_ns) of the store's ``runs.deleted`` marker when every summary was
    last checked against its run (None: there was no marker)."""
    changes: tuple[int, int] | None = None
    """``(inode, offset)``: how much of the store's ``runs.changes`` the summaries hold
    (None: none of it)."""
    check: bytes = b""
    """A digest of every field above (:func:`_check`): BLAKE2b, or in a keyed store an
    HMAC with the store's key, so a flipped bit, or an index planted without the key,
    is never used."""


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(IndexFile)
_CHUNK_DECODER = msgspec.msgpack.Decoder(Chunk)
_RUNS_DECODER = msgspec.msgpack.Decoder(dict[str, MetaSummary])


def _check(index: IndexFile, signer: Signer | None) -> bytes:
    """The digest of every field of ``index`` but ``check`` itself."""
    fields = _ENCODER.encode(
        [
            index.version,
            index.stamp,
            index.unlisted,
            index.order,
            index.runs,
            index.deleted,
            index.changes,
        ]
    )
    if signer is not None:
        return signer.document_mac(_TAG, fields)
    return hashlib.blake2b(fields, digest_size=32).digest()


def encode_index(
    stamp: Stamp | None,
    unlisted: list[str],
    order: list[Entry],
    runs: dict[str, MetaSummary],
    deleted: tuple[int, int] | None,
    *,
    changes: tuple[int, int] | None = None,
    signer: Signer | None = None,
) -> bytes:
    """The file's bytes (``order``: newest first, as :func:`listing_order` makes it);
    ``signer``: the store's key, in a keyed store."""
    chunks = []
    for start in range(0, len(order), CHUNK):
        part = order[start : start + CHUNK]
        chunk = Chunk([e[1] for e in part], [e[2] for e in part], [e[0] for e in part])
        chunks.append(_ENCODER.encode(chunk))
    index = IndexFile(VERSION, stamp, unlisted, chunks, _ENCODER.encode(runs), deleted, changes)
    return _ENCODER.encode(msgspec.structs.replace(index, check=_check(index, signer)))


def decode_index(data: bytes, signer: Signer | None = None) -> IndexFile:
    """The file, with its order and summaries still undecoded, its digest checked.

    Raises:
        ValueError: not an index file of :data:`VERSION`, or its digest does not match
            (a flipped bit; in a keyed store, one written without ``signer``'s key).
    """
    index = _DECODER.decode(data)
    if index.version != VERSION:
        raise ValueError(f"version {index.version}, not {VERSION}")
    if not Signer.matches(_check(index, signer), index.check):
        raise ValueError("its digest does not match (damaged, or written without the key)")
    return index


def decode_chunk(raw: bytes, after: Entry | None) -> list[Entry]:
    """The runs of one chunk of the order, checked whole: torn lists or an order that is
    not newest first (``after``: the last run of the chunk before) raise ValueError."""
    chunk = _CHUNK_DECODER.decode(raw)
    if not len(chunk.run_ids) == len(chunk.dir_inos) == len(chunk.created_ms):
        raise ValueError("a chunk of its order is torn")
    entries = list(zip(chunk.created_ms, chunk.run_ids, chunk.dir_inos, strict=True))
    for entry in entries:
        if after is not None and entry > after:
            raise ValueError("its order is not newest first")
        after = entry
    return entries


def decode_summaries(raw: bytes) -> dict[str, MetaSummary]:
    """The summaries (run id -> summary). Raises ValueError when they do not decode."""
    return _RUNS_DECODER.decode(raw)


def listing_order(runs: dict[str, MetaSummary]) -> list[Entry]:
    """The listing order of ``runs``: the readable ones, newest created first (ties: the
    greater run id first)."""
    return sorted(
        ((s.created_ms, name, s.dir_ino) for name, s in runs.items() if s.status), reverse=True
    )


class Change(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """One record of ``runs.changes``: a run's meta as its writer just left it, or (no
    summary) the run deleted. Untracked by the garbage collector, as
    :class:`MetaSummary` (a string and one of those: no cycle)."""

    run_id: str
    """Checked by :func:`decode_changes` before any record is returned."""
    summary: MetaSummary | None


_CHANGE_DECODER = msgspec.msgpack.Decoder(Change)
_CHANGES_DECODER = msgspec.msgpack.Decoder(list[Change])
_ARRAY32 = struct.Struct(">BI")
_RUN_IDS = re.compile(r"(?:[A-Za-z0-9][A-Za-z0-9._-]{0,127}\n)*")
"""Run ids, each followed by a newline (one regex call checks them all)."""


def encode_change(run_id: str, summary: MetaSummary | None, signer: Signer | None) -> bytes:
    """One framed ``runs.changes`` record (signed with ``signer``, a keyed store's)."""
    body = _ENCODER.encode(Change(validate_run_id(run_id), summary))
    if signer is None:
        return encode_frame(body)
    return encode_frame(body, signer.document_mac(CHANGES_TAG, body))


def decode_changes(
    data: bytes, start: int, signer: Signer | None
) -> tuple[list[Change], int, str | None]:
    """The records of ``runs.changes`` (its bytes ``data``) from offset ``start``:
    ``(records, end, problem)``.

    Reading stops at the first record that cannot be used, at offset ``end``. A frame
    cut short by the end of ``data`` is a record still being appended (or torn by a
    crash): ``problem`` is None. Anything else is damage, and ``problem`` says what: a
    frame that fails its crc or is oversized, a body that is not a record, a run id
    that is not one, or in a keyed store a record without a valid MAC. Records are
    checked one by one; none is ever a path until its run id is validated.
    """
    bodies, end, problem = _frames(data, start, signer)
    # Every body decoded in one call (a msgpack array of them), checked as one: the
    # common case of a lister catching up on 100,000 records.
    try:
        whole = _ARRAY32.pack(0xDD, len(bodies)) + b"".join(bodies)
        records = _CHANGES_DECODER.decode(whole)
    except (ValueError, msgspec.DecodeError):
        pass
    else:
        ids = "".join(f"{r.run_id}\n" for r in records)
        # a newline inside an id would pass the pattern as two ids: counted apart
        if ids.count("\n") == len(records) and _RUN_IDS.fullmatch(ids) is not None:
            return records, end, problem
    records = []
    for body in bodies:
        try:
            record = _CHANGE_DECODER.decode(body)
            validate_run_id(record.run_id)
        except (ValueError, msgspec.DecodeError, InvalidRunIdError) as exc:
            at = _frames(data, start, signer, count=len(records))[1]
            return records, at, f"a record that is not one ({exc})"
        records.append(record)
    return records, end, problem


def _frames(
    data: bytes, start: int, signer: Signer | None, count: int = -1
) -> tuple[list[memoryview], int, str | None]:
    """The bodies of the whole, crc-checked (and in a keyed store, signed) frames from
    ``start`` (at most ``count`` of them, if not negative), where reading stopped, and
    why (None: the end, or a frame cut short by it). The frame format is
    :mod:`~afk_local.storage.format.frames`'; this is its hot reader for one file of
    many small frames."""
    if signer is None:
        bodies, pos, problem = _plain_frames(data, start, count)
        if problem is not _SIGNED:
            return bodies, pos, problem
        # a signed frame in a store without a key: the general loop from there on
        more, pos, problem = _checked_frames(data, pos, None, count - len(bodies))
        return bodies + more, pos, problem
    return _checked_frames(data, start, signer, count)


_SIGNED = "a signed frame"


def _plain_frames(data: bytes, start: int, count: int) -> tuple[list[memoryview], int, str | None]:
    """:func:`_frames` of a store without a key, while the frames are unsigned (the
    common case: one slice and one crc per frame). Stops with the problem
    :data:`_SIGNED` at the first signed frame, for :func:`_checked_frames` to go on."""
    unpack, crc32, view = FRAME_HEADER.unpack_from, zlib.crc32, memoryview(data)
    header, last = FRAME_HEADER_SIZE, len(data) - FRAME_HEADER_SIZE
    bodies: list[memoryview] = []
    append = bodies.append
    pos = start
    while pos <= last and count != 0:
        count -= 1
        length, crc = unpack(data, pos)
        if not 0 < length <= MAX_CHANGE_BYTES:
            if length & SIGNED_FRAME:
                return bodies, pos, _SIGNED
            return bodies, pos, f"frame length {length} outside 1..{MAX_CHANGE_BYTES}"
        body_end = pos + header + length
        if body_end > last + header:
            break  # a frame still being appended (or torn by a crash)
        body = view[pos + header : body_end]
        if crc32(body) != crc:
            return bodies, pos, "crc32 mismatch"
        append(body)
        pos = body_end
    return bodies, pos, None


def _checked_frames(
    data: bytes, start: int, signer: Signer | None, count: int
) -> tuple[list[memoryview], int, str | None]:
    """:func:`_frames` for any frame, signed or not (``signer``: the MAC each must carry)."""
    unpack, crc32, view, end = FRAME_HEADER.unpack_from, zlib.crc32, memoryview(data), len(data)
    bodies: list[memoryview] = []
    append = bodies.append
    pos = start
    while pos < end and count != 0:
        count -= 1
        if end - pos < FRAME_HEADER_SIZE:
            break
        length, crc = unpack(data, pos)
        size = length & MAX_FRAME_BYTES
        if not 0 < size <= MAX_CHANGE_BYTES:
            return bodies, pos, f"frame length {size} outside 1..{MAX_CHANGE_BYTES}"
        body_end = pos + FRAME_HEADER_SIZE + size
        frame_end = body_end + (MAC_SIZE if length & SIGNED_FRAME else 0)
        if frame_end > end:
            break
        if crc32(view[pos + FRAME_HEADER_SIZE : frame_end]) != crc:
            return bodies, pos, "crc32 mismatch"
        body = view[pos + FRAME_HEADER_SIZE : body_end]
        if signer is not None:
            mac = view[body_end:frame_end] if frame_end > body_end else None
            expected = signer.document_mac(CHANGES_TAG, bytes(body))
            if mac is None or not Signer.matches(expected, mac):
                return bodies, pos, "a record without the store key's MAC"
        append(body)
        pos = frame_end
    return bodies, pos, None  # the end, or a frame still being appended (or torn by a crash)


__all__ = [
    "CHANGES_TAG",
    "CHUNK",
    "MAX_CHANGE_BYTES",
    "UNREADABLE",
    "VERSION",
    "Change",
    "Chunk",
    "Entry",
    "IndexFile",
    "MetaSummary",
    "Stamp",
    "decode_changes",
    "decode_chunk",
    "decode_index",
    "decode_summaries",
    "encode_change",
    "encode_index",
    "listing_order",
]
