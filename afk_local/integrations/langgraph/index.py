"""A LangGraph thread's checkpoint files: what each holds, and the index of them.

Each LangGraph checkpoint is one checkpoint file of phase ``langgraph`` whose
payload is a :class:`Payload` (loose, or packed: see docs/format.md, "Packs").
:class:`ThreadIndex` maps ``(ns, checkpoint_id)`` to those checkpoints without
their values; it is rebuilt from a directory scan and extended as files appear.

``langgraph.index`` caches each checkpoint's ids and metadata, so a new process
need not decode every file. It is a cache, never the truth, and unsigned (a keyed
store decodes everything). A cache that starts with a version-2 marker is trusted
by name: a checkpoint's content never changes under its name (packing and
compaction keep the record; a crash can only take back a file whose entry was
never written), except when a deleted name is used again, and every deletion
first appends a durable *tombstone* for the name. So an entry is used when it is
the last record of its name. An older cache (no marker) is checked against each
file's header crc, then rewritten as version 2. This module needs no LangGraph.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from afk_local.errors import AfkLocalError, CheckpointCorruptionError
from afk_local.storage import fsio
from afk_local.storage.format import codec
from afk_local.storage.format.frames import (
    FRAME_HEADER_SIZE,
    BadFrame,
    encode_msgpack_frame,
    iter_frames,
)
from afk_local.storage.format.layout import CheckpointFile, parse_checkpoint_name
from afk_local.storage.rundir.read.catalog import RunCatalog
from afk_local.storage.rundir.read.reader import RunReader

log = logging.getLogger("afk_local")

PHASE = "langgraph"
"""The phase of the checkpoint files that hold LangGraph checkpoints."""

INDEX_NAME = "langgraph.index"
"""A cache of each checkpoint file's ids and metadata, so a new process need not decode them all."""

PAYLOAD_FORMAT = 1
"""The newest :class:`Payload` format this afk_local writes and reads."""

# One checkpoint file: (file name, crc32 from its AFK1 header, ns, id, parent, run_id, metadata)
_IndexFrame = tuple[str, int, str, str, str | None, str | None, tuple[str, bytes]]
_INDEX_DECODER = msgspec.msgpack.Decoder(_IndexFrame)
_MARKER = "afk-local/langgraph-index"
_VERSION = 2
_MARKER_FRAME: _IndexFrame = (_MARKER, _VERSION, "", "", None, None, ("", b""))
_TOMBSTONE = -1
"""The crc of a tombstone frame: the name was deleted (older readers never match it)."""
_MAX_INDEX_BYTES = 256 << 20


class Payload(msgspec.Struct, kw_only=True, frozen=True):
    """The payload of one ``langgraph`` checkpoint file."""

    format: int
    thread_id: str
    ns: str
    id: str
    parent: str | None
    checkpoint: tuple[str, bytes]
    metadata: tuple[str, bytes]
    run_id: str | None = None
    top: bool = False
    """True when, as it was written, no earlier checkpoint of its namespace in this thread
    had a greater id: while nothing is written after it (it is ``latest``), it is the
    namespace's newest, which a new process then reads from ``latest`` alone. False
    when the writer did not know (older payloads, an index it could not build)."""
    writes_from: tuple[int, int, int] | None = None
    """Where ``langgraph.writes`` ended when it was written, ``(offset, length, crc32)``
    of its last frame (see :data:`~afk_local.integrations.langgraph.writes.WritesMark`):
    set only for an id new in its namespace, whose writes can only come after it. None:
    not known (read the whole file)."""


# The classes of the saver are msgspec Structs, not dataclasses: a dataclass compiles its
# methods when it is defined (0.5-1 ms each), paid by every process that imports the saver.
class IndexEntry(msgspec.Struct, frozen=True):
    """One ``langgraph`` checkpoint, as the index knows it (no values)."""

    seq: int
    name: str
    ino: int
    """Its file's inode, or for a packed checkpoint a negative number naming its pack."""
    ns: str
    checkpoint_id: str
    parent_id: str | None
    metadata: tuple[str, bytes]
    run_id: str | None
    pack: str | None = None
    """The pack holding it (None: a loose file)."""

    @classmethod
    def of(cls, file: CheckpointFile, ino: int, payload: Payload) -> IndexEntry:
        """The entry of checkpoint ``file`` (identity ``ino``) holding ``payload``."""
        return cls(
            seq=file.seq,
            name=file.name,
            ino=ino,
            ns=payload.ns,
            checkpoint_id=payload.id,
            parent_id=payload.parent,
            metadata=payload.metadata,
            run_id=payload.run_id,
            pack=file.pack,
        )

    @property
    def file(self) -> CheckpointFile:
        """The checkpoint, to load through the thread's reader."""
        return CheckpointFile(self.seq, PHASE, self.name, pack=self.pack)


class ThreadIndex(msgspec.Struct):
    """The checkpoint files of one thread, rebuilt from a directory scan."""

    reader: RunReader
    entries: dict[str, IndexEntry] = msgspec.field(default_factory=dict)
    """File name -> entry."""
    by_key: dict[tuple[str, str], IndexEntry] = msgspec.field(default_factory=dict)
    """``(ns, checkpoint_id)`` -> the newest file holding that checkpoint."""

    def add(self, entry: IndexEntry) -> None:
        """Add one checkpoint file."""
        self.entries[entry.name] = entry
        key = (entry.ns, entry.checkpoint_id)
        current = self.by_key.get(key)
        if current is None or current.seq <= entry.seq:  # a re-put id: the newest file wins
            self.by_key[key] = entry

    def is_stale(self, found: dict[str, tuple[CheckpointFile, int]]) -> bool:
        """True when a checkpoint of the index vanished or its loose file was replaced.

        A checkpoint that moved into a pack (or got a loose copy) kept its content:
        :meth:`update` notes where it is now.
        """
        for name, entry in self.entries.items():
            now = found.get(name)
            if now is None:
                return True
            if entry.ino >= 0 and now[1] >= 0 and now[1] != entry.ino:
                return True
        return False

    def update(self, found: dict[str, tuple[CheckpointFile, int]], thread_id: str) -> None:
        """Add the files of ``found`` the index lacks, from the index cache or by decoding them.

        Raises:
            AfkLocalError: a file holds another thread (the run-id hash collided).
            CheckpointCorruptionError: a file is damaged or not a LangGraph checkpoint.
        """
        run_dir = self.reader.paths.dir
        for name, entry in list(self.entries.items()):
            file, ino = found[name]
            if ino != entry.ino:  # packed since (or a loose copy appeared): same content
                self.add(msgspec.structs.replace(entry, ino=ino, pack=file.pack))
        missing = sorted(set(found) - set(self.entries))
        # The cache is not signed: a keyed store decodes (and so checks) every file.
        trusted = self.reader.record_codec.signer is None
        cache = read_index_cache(run_dir / INDEX_NAME) if len(missing) > 1 and trusted else None
        for name in missing:
            file, ino = found[name]
            hit = None if cache is None else cache.get(name)
            if hit is not None and (
                (cache is not None and cache.trusted)
                or (file.pack is None and hit[1] == header_crc(run_dir / name))
            ):
                _, _crc, ns, checkpoint_id, parent, run_id, metadata = hit
                self.add(
                    IndexEntry(
                        file.seq, name, ino, ns, checkpoint_id, parent, metadata, run_id, file.pack
                    )
                )
                continue
            record = self.reader.load(file)
            payload = self.payload(record.payload, file)
            if payload.thread_id != thread_id:
                raise AfkLocalError(
                    f"run {self.reader.run_id!r} holds LangGraph thread {payload.thread_id!r}, "
                    f"not {thread_id!r} (file {run_dir / name}): the run-id hash collided; "
                    "rename one of the threads"
                )
            self.add(IndexEntry.of(file, ino, payload))

    def payload(self, raw: Any, entry: IndexEntry | CheckpointFile) -> Payload:
        """Validate the decoded payload ``raw`` of ``entry``'s file as a :class:`Payload`.

        Raises:
            CheckpointCorruptionError: not a LangGraph checkpoint, a newer format, or
                not the checkpoint the index expected there.
        """
        path = str(self.reader.paths.dir / entry.name)
        try:
            payload = msgspec.convert(raw, Payload)
        except msgspec.ValidationError as exc:
            raise CheckpointCorruptionError(
                path, f"not a LangGraph checkpoint: {exc}", self.reader.run_id
            ) from None
        if payload.format > PAYLOAD_FORMAT:
            raise CheckpointCorruptionError(
                path,
                f"LangGraph payload format {payload.format} is newer than this afk_local "
                f"({PAYLOAD_FORMAT}): upgrade afk_local",
                self.reader.run_id,
            )
        if isinstance(entry, IndexEntry) and payload.id != entry.checkpoint_id:
            raise CheckpointCorruptionError(
                path, "file changed under the index (another process pruned the thread?)"
            )
        return payload


def scan_thread_files(
    run_dir: Path, catalog: RunCatalog | None = None
) -> dict[str, tuple[CheckpointFile, int]] | None:
    """The ``langgraph`` checkpoints of a run directory with their identities, by name.

    A loose file's identity is its inode; a packed checkpoint's (found through
    ``catalog``) is a negative number derived from its pack's name (packs are
    immutable and uniquely named). A loose file wins over a packed copy.
    Returns None when the directory does not exist.
    """
    found: dict[str, tuple[CheckpointFile, int]] = {}
    packs: list[str] = []
    try:
        with os.scandir(run_dir) as entries:
            for item in entries:
                name = item.name
                if name.endswith(".pack"):
                    packs.append(name)
                    continue
                parsed = parse_checkpoint_name(name)
                if parsed and parsed.phase == PHASE and item.is_file(follow_symlinks=False):
                    found[name] = (parsed, item.inode())
    except FileNotFoundError:
        return None
    if packs and catalog is not None:
        for file in catalog.files():
            if file.pack is not None and file.phase == PHASE and file.name not in found:
                found[file.name] = (file, -1 - zlib.crc32(file.pack.encode()))
    return found


def append_to_index_file(fd: int | None, path: Path, payload: Payload, run_id: str) -> int | None:
    """Add checkpoint file ``path`` to its directory's index cache.

    Not fsynced: a lost entry is only a cache miss. ``fd`` is the index file
    opened by an earlier call (None: open it, cutting a torn tail). Returns the
    descriptor to pass next time; failures are logged, never raised.
    """
    crc = header_crc(path)
    if crc is None:
        return fd
    frame: _IndexFrame = (
        path.name,
        crc,
        payload.ns,
        payload.id,
        payload.parent,
        payload.run_id,
        payload.metadata,
    )
    index_path = path.parent / INDEX_NAME
    try:
        if fd is None:
            fd = open_index_cache(index_path)
        fsio.write_all(fd, encode_msgpack_frame(frame), index_path)
    except OSError as exc:
        log.warning("run %s: index cache %s not updated: %s", run_id, index_path, exc)
    return fd


def open_index_cache(index_path: Path) -> int:
    """Open a run's index cache for appending: a torn tail cut off, an older cache (no
    version-2 marker) replaced by its entries that still match their files' crc."""
    frames, good = _index_frames(index_path)
    if not frames or frames[0][0] != _MARKER:
        run_dir = index_path.parent
        keep = [f for f in frames if f[0] != _MARKER and f[1] == header_crc(run_dir / f[0])]
        data = b"".join(encode_msgpack_frame(f) for f in [_MARKER_FRAME, *keep])
        fsio.atomic_write(index_path, data)
        good = len(data)
    fd = fsio.open_append(index_path)
    if os.fstat(fd).st_size > good:  # a torn tail would hide every later entry
        fsio.truncate(fd, good, index_path)
    return fd


def record_deletions(fd: int | None, index_path: Path, names: Sequence[str]) -> int:
    """Append a tombstone for each name to the index cache and fsync it, before those
    checkpoints are deleted: their names may be used again by later checkpoints, whose
    cache entries a crash may lose. Returns the descriptor to keep using."""
    if fd is None:
        fd = open_index_cache(index_path)
    frames = [encode_msgpack_frame((n, _TOMBSTONE, "", "", None, None, ("", b""))) for n in names]
    fsio.write_all(fd, b"".join(frames), index_path)
    fsio.fsync_fd(fd, index_path)
    return fd


def header_crc(path: Path) -> int | None:
    """The crc32 field of an AFK1 file's header (identifies its exact bytes), or None."""
    try:
        fd = fsio.open_regular(path)
    except OSError:
        return None
    try:
        head = os.pread(fd, codec.HEADER_SIZE, 0)
    finally:
        os.close(fd)
    if len(head) < codec.HEADER_SIZE:
        return None
    crc: int = struct.unpack_from("<I", head, codec.HEADER_SIZE - 4)[0]
    return crc


def _index_frames(path: Path) -> tuple[list[_IndexFrame], int]:
    """The readable frames of an index cache file and where they end (first bad frame)."""
    try:
        data = fsio.read_bounded(path, _MAX_INDEX_BYTES)
    except (OSError, ValueError):
        return [], 0
    frames: list[_IndexFrame] = []
    decode = _INDEX_DECODER.decode
    good = 0  # where the readable frames end
    with contextlib.suppress(BadFrame, msgspec.DecodeError):
        for offset, body, _ in iter_frames(data, 0, len(data), _MAX_INDEX_BYTES, signed=False):
            frames.append(decode(body))
            good = offset + FRAME_HEADER_SIZE + len(body)
    return frames, good


class IndexCache(msgspec.Struct, frozen=True):
    """A run's index cache as read: the last record of each name, and whether it is trusted."""

    frames: dict[str, _IndexFrame]
    trusted: bool
    """A version-2 cache: its entries hold without checking each file's header."""

    def get(self, name: str) -> _IndexFrame | None:
        """The cached entry of checkpoint ``name`` (None: none, or a tombstone last)."""
        frame = self.frames.get(name)
        return None if frame is None or frame[1] == _TOMBSTONE else frame


def newest_in_cache(cache: IndexCache, latest: CheckpointFile, ns: str) -> IndexEntry | None:
    """The newest checkpoint of namespace ``ns`` by the cache alone, or None when the
    cache cannot tell (not trusted, or it does not reach ``latest``, the newest file).

    The cache is appended in seq order after each checkpoint is durable, and deleted
    checkpoints carry tombstones; but a crash can take back the tail of entries whose
    files stayed, and a later process appends after the gap (a deleted cache starts
    again from the next checkpoint). So the cache answers only when it has a record
    for every seq up to ``latest``'s: a checkpoint it lacks might be the newest of
    ``ns``.
    """
    if not cache.trusted or cache.get(latest.name) is None:
        return None
    best: _IndexFrame | None = None
    best_id, best_seq, newest = "", 0, 0
    recorded: set[int] = set()
    for name, frame in cache.frames.items():
        if name == _MARKER:
            continue
        digits = name[:12]
        if not digits.isdigit():
            return None
        seq = int(digits)
        recorded.add(seq)
        if frame[1] == _TOMBSTONE:
            continue
        newest = max(newest, seq)
        if frame[2] == ns:
            checkpoint_id = frame[3]
            if (
                best is None
                or checkpoint_id > best_id
                or (checkpoint_id == best_id and seq > best_seq)
            ):
                best, best_id, best_seq = frame, checkpoint_id, seq
    if best is None or newest != latest.seq:
        return None
    if not recorded.issuperset(range(1, latest.seq + 1)):
        return None  # a gap: the cache lost entries of files that are still there
    name, _crc, ns, checkpoint_id, parent, run_id, metadata = best
    return IndexEntry(best_seq, name, -1, ns, checkpoint_id, parent, metadata, run_id)


def read_index_cache(path: Path) -> IndexCache:
    """A run's index cache (empty when missing or unreadable)."""
    frames = _index_frames(path)[0]
    trusted = bool(frames) and frames[0][0] == _MARKER and frames[0][1] == _VERSION
    return IndexCache({frame[0]: frame for frame in frames}, trusted)


__all__: Sequence[str] = [
    "INDEX_NAME",
    "PAYLOAD_FORMAT",
    "PHASE",
    "IndexCache",
    "IndexEntry",
    "Payload",
    "ThreadIndex",
    "append_to_index_file",
    "header_crc",
    "newest_in_cache",
    "open_index_cache",
    "read_index_cache",
    "record_deletions",
    "scan_thread_files",
]
