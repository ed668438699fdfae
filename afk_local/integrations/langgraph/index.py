"""A LangGraph thread's checkpoint files: what each holds, and the index of them.

Each LangGraph checkpoint is one checkpoint file of phase ``langgraph`` whose
payload is a :class:`Payload`. :class:`ThreadIndex` maps ``(ns, checkpoint_id)``
to those files without their values; it is rebuilt from a directory scan and
extended as files appear. ``langgraph.index`` caches each file's ids and
metadata (keyed by the crc32 of the file's header), so a new process need not
decode every file; it is a cache, never the truth. This module needs no LangGraph.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from afk_local.errors import AfkLocalError, CheckpointCorruptionError
from afk_local.integrations.langgraph.frames import bad_frame, encode_frame, frame_body
from afk_local.storage import codec, fsio
from afk_local.storage.layout import CheckpointFile, parse_checkpoint_name
from afk_local.storage.reader import RunReader

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


@dataclass(frozen=True)
class IndexEntry:
    """One ``langgraph`` checkpoint file, as the index knows it (no values)."""

    seq: int
    name: str
    ino: int
    ns: str
    checkpoint_id: str
    parent_id: str | None
    metadata: tuple[str, bytes]
    run_id: str | None

    @classmethod
    def of(cls, file: CheckpointFile, ino: int, payload: Payload) -> IndexEntry:
        """The entry of checkpoint file ``file`` (inode ``ino``) holding ``payload``."""
        return cls(
            seq=file.seq,
            name=file.name,
            ino=ino,
            ns=payload.ns,
            checkpoint_id=payload.id,
            parent_id=payload.parent,
            metadata=payload.metadata,
            run_id=payload.run_id,
        )


@dataclass
class ThreadIndex:
    """The checkpoint files of one thread, rebuilt from a directory scan."""

    reader: RunReader
    entries: dict[str, IndexEntry] = field(default_factory=dict)
    """File name -> entry."""
    by_key: dict[tuple[str, str], IndexEntry] = field(default_factory=dict)
    """``(ns, checkpoint_id)`` -> the newest file holding that checkpoint."""

    def add(self, entry: IndexEntry) -> None:
        """Add one checkpoint file."""
        self.entries[entry.name] = entry
        key = (entry.ns, entry.checkpoint_id)
        current = self.by_key.get(key)
        if current is None or current.seq < entry.seq:  # a re-put id: the newest file wins
            self.by_key[key] = entry

    def is_stale(self, found: dict[str, tuple[CheckpointFile, int]]) -> bool:
        """True when a file of the index vanished or was replaced (appends keep it fresh)."""
        return any(
            name not in found or found[name][1] != entry.ino for name, entry in self.entries.items()
        )

    def update(self, found: dict[str, tuple[CheckpointFile, int]], thread_id: str) -> None:
        """Add the files of ``found`` the index lacks, from the index cache or by decoding them.

        Raises:
            AfkLocalError: a file holds another thread (the run-id hash collided).
            CheckpointCorruptionError: a file is damaged or not a LangGraph checkpoint.
        """
        run_dir = self.reader.paths.dir
        missing = sorted(set(found) - set(self.entries))
        # The cache is not signed: a keyed store decodes (and so checks) every file.
        trusted = self.reader.record_codec.signer is None
        cached = _read_index_file(run_dir / INDEX_NAME) if len(missing) > 1 and trusted else {}
        for name in missing:
            file, ino = found[name]
            hit = cached.get(name)
            if hit is not None and hit[1] == header_crc(run_dir / name):
                _, _crc, ns, checkpoint_id, parent, run_id, metadata = hit
                self.add(
                    IndexEntry(file.seq, name, ino, ns, checkpoint_id, parent, metadata, run_id)
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


def scan_thread_files(run_dir: Path) -> dict[str, tuple[CheckpointFile, int]] | None:
    """The ``langgraph`` checkpoint files of a run directory with their inodes, by name.

    Returns None when the directory does not exist.
    """
    found: dict[str, tuple[CheckpointFile, int]] = {}
    try:
        with os.scandir(run_dir) as entries:
            for item in entries:
                parsed = parse_checkpoint_name(item.name)
                if parsed and parsed.phase == PHASE and item.is_file(follow_symlinks=False):
                    found[item.name] = (parsed, item.inode())
    except FileNotFoundError:
        return None
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
            opened = fsio.open_append(index_path)
            good = _index_frames(index_path)[1]
            if os.fstat(opened).st_size > good:  # a torn tail would hide every later entry
                fsio.truncate(opened, good, index_path)
            fd = opened
        fsio.write_all(fd, encode_frame(frame), index_path)
    except OSError as exc:
        log.warning("run %s: index cache %s not updated: %s", run_id, index_path, exc)
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
    pos = 0
    while pos < len(data) and bad_frame(data, pos, _MAX_INDEX_BYTES) is None:
        body, end = frame_body(data, pos)
        try:
            frames.append(_INDEX_DECODER.decode(body))
        except msgspec.DecodeError:
            break
        pos = end
    return frames, pos


def _read_index_file(path: Path) -> dict[str, _IndexFrame]:
    """Index cache entries by file name (the newest entry of a name wins)."""
    return {frame[0]: frame for frame in _index_frames(path)[0]}


__all__: Sequence[str] = [
    "INDEX_NAME",
    "PAYLOAD_FORMAT",
    "PHASE",
    "IndexEntry",
    "Payload",
    "ThreadIndex",
    "append_to_index_file",
    "header_crc",
    "scan_thread_files",
]
