"""``langgraph.writes``: the durable pending writes of a LangGraph thread.

What the finished tasks of a superstep produced is appended to
``langgraph.writes`` in the thread's run directory, one crc-framed record per
``put_writes`` call, fsynced before the call returns, so tasks that finished
before a kill -9 are not run again. A torn frame at the tail (a crash cut an
append that never returned) is cut off on the next append; a bad frame followed
by good ones is damage and raises :class:`afk_local.CheckpointCorruptionError`.
This module needs no LangGraph.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import msgspec

from afk_local.errors import CheckpointCorruptionError
from afk_local.storage import fsio
from afk_local.storage.format.frames import (
    FRAME_HEADER,
    FRAME_HEADER_SIZE,
    BadFrame,
    encode_msgpack_frame,
    frame_after,
    iter_frames,
    last_frame_header,
)

log = logging.getLogger("afk_local")

WRITES_NAME = "langgraph.writes"
"""The append-only pending-writes file inside a thread's run directory."""

Typed = tuple[str, bytes]
"""A value as LangGraph's serializer typed it: ``(type name, bytes)``."""

WriteFrame = tuple[str, str, str, str, list[tuple[int, str, str, bytes]]]
"""One ``put_writes`` call: ``(ns, checkpoint_id, task_id, task_path, items)``.

Each item is ``(idx, channel, type, bytes)``.
"""

TaskWrites = dict[tuple[str, int], tuple[str, str, Typed, str]]
"""The writes of one checkpoint: ``(task_id, idx) -> (task_id, channel, value, task_path)``."""

WritesMark = tuple[int, int, int]
"""Where the writes file ended when a checkpoint was written: ``(offset, length, crc32)``,
the offset just past the last frame and that frame's header fields. Every write of the
checkpoint comes after it (``put_writes`` names a checkpoint ``put`` returned)."""

# A frame's address decoded, its items left as bytes: a read decodes the items of the
# checkpoints it is asked for, not the whole history of the thread.
_ENCODER = msgspec.msgpack.Encoder()
_FRAME_HEAD_DECODER = msgspec.msgpack.Decoder(tuple[str, str, str, str, msgspec.Raw])
_ITEMS_DECODER = msgspec.msgpack.Decoder(list[tuple[int, str, str, bytes]])
_Key = tuple[str, str]
_RawFrame = tuple[str, str, msgspec.Raw]  # (task_id, task_path, items)


class CheckpointWrites(Mapping[_Key, TaskWrites]):
    """``(ns, checkpoint_id)`` -> the writes of that checkpoint, decoded on first use."""

    def __init__(self) -> None:
        self._raw: dict[_Key, list[_RawFrame]] = {}
        self._done: dict[_Key, TaskWrites] = {}

    def add(self, key: _Key, task_id: str, task_path: str, items: msgspec.Raw) -> None:
        """Add one ``put_writes`` call's frame (its items still encoded), in file order."""
        done = self._done.get(key)
        if done is not None:
            _apply(done, task_id, task_path, _ITEMS_DECODER.decode(items))
        else:
            self._raw.setdefault(key, []).append((task_id, task_path, items))

    def __getitem__(self, key: _Key) -> TaskWrites:
        done = self._done.get(key)
        if done is None:
            frames = self._raw.pop(key)  # KeyError: no writes for that checkpoint
            done = self._done[key] = {}
            for task_id, task_path, items in frames:
                _apply(done, task_id, task_path, _ITEMS_DECODER.decode(items))
        return done

    def __iter__(self) -> Iterator[_Key]:
        yield from list(self._done)
        yield from list(self._raw)

    def __len__(self) -> int:
        return len(self._done) + len(self._raw)

    def __contains__(self, key: object) -> bool:
        return key in self._done or key in self._raw


def _apply(
    slot: TaskWrites, task_id: str, task_path: str, items: list[tuple[int, str, str, bytes]]
) -> None:
    for idx, channel, type_, data in items:
        key = (task_id, idx)
        if idx >= 0 and key in slot:
            continue  # regular writes: the first one wins (a retried task writes again)
        slot[key] = (task_id, channel, (type_, data), task_path)  # special: the last wins


class PendingWrites(msgspec.Struct):
    """Parsed ``langgraph.writes`` of one thread, extended as the file grows."""

    ino: int = -1
    offset: int = 0
    last: tuple[int, int] | None = None
    """``(length, crc32)`` of the frame that ends at :attr:`offset` (None: no frame)."""
    by_checkpoint: CheckpointWrites = msgspec.field(default_factory=CheckpointWrites)
    """``(ns, checkpoint_id)`` -> the writes of that checkpoint (decoded on first use)."""

    def parse(self, data: bytes, path: str, run_id: str, max_bytes: int) -> None:
        """Apply the frames of ``data`` (the file from ``offset`` on), stopping at a torn tail."""
        pos = 0
        try:
            for pos, body, _ in iter_frames(data, 0, len(data), max_bytes, signed=False):
                try:
                    ns, checkpoint_id, task_id, task_path, items = _FRAME_HEAD_DECODER.decode(body)
                except msgspec.DecodeError as exc:
                    bad = f"record does not decode: {exc}"
                    break
                self.by_checkpoint.add((ns, checkpoint_id), task_id, task_path, items)
                self.last = FRAME_HEADER.unpack_from(data, pos)
                self.offset += FRAME_HEADER_SIZE + len(body)
            else:
                return
        except BadFrame as exc:
            pos, bad = exc.offset, exc.reason
        if frame_after(data, pos + 1, len(data), max_bytes, signed=False) is not None:
            raise CheckpointCorruptionError(
                path,
                f"bad frame at offset {self.offset} ({bad}) followed by good ones: the "
                "file is damaged, not torn; restore it or delete the thread",
                run_id,
            )
        # else a torn tail: a crash interrupted the last append; it never returned


def encode_writes(ns: str, checkpoint_id: str, writes: TaskWrites) -> list[bytes]:
    """The writes of one checkpoint as frames, one per ``(task_id, idx)``."""
    return [
        encode_msgpack_frame((ns, checkpoint_id, task_id, task_path, [(idx, channel, type_, data)]))
        for (task_id, idx), (_, channel, (type_, data), task_path) in writes.items()
    ]


def read_writes(
    path: Path, state: PendingWrites | None, *, run_id: str, max_bytes: int
) -> PendingWrites | None:
    """The parsed writes file at ``path``, reading only what was appended since ``state``.

    ``state`` is what an earlier call returned (None: nothing yet); a replaced or
    shrunk file is read from the start. Returns None when the file does not exist.

    Raises:
        CheckpointCorruptionError: the file is over ``max_bytes`` or damaged.
    """
    try:
        fd = fsio.open_regular(path)
    except FileNotFoundError:
        return None
    try:
        stat = os.fstat(fd)
        if state is None or state.ino != stat.st_ino or stat.st_size < state.offset:
            state = PendingWrites(ino=stat.st_ino)
        if stat.st_size > max_bytes:
            raise CheckpointCorruptionError(
                str(path),
                f"{stat.st_size} bytes, over max_record_bytes; prune the thread",
                run_id,
            )
        if stat.st_size > state.offset:
            data = _pread_all(fd, state.offset, stat.st_size - state.offset)
            state.parse(data, str(path), run_id, max_bytes)
    finally:
        os.close(fd)
    return state


def read_checkpoint_writes(
    path: Path, ns: str, checkpoint_id: str, *, max_bytes: int
) -> TaskWrites | None:
    """The writes of one checkpoint, reading the file without decoding the others.

    Every frame's length and crc are checked, but only the frames of this checkpoint
    are decoded, so a new process answering one ``get_tuple`` does not parse the
    thread's whole history. None when a frame does not check out (a torn tail or
    damage, which :func:`read_writes` tells apart) or the file is too large; an empty
    dict when there is no file.
    """
    try:
        data = fsio.read_bounded(path, max_bytes)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        return None
    return _frames_of(data, 0, ns, checkpoint_id)


def read_writes_after(
    path: Path, ns: str, checkpoint_id: str, mark: WritesMark, *, max_bytes: int
) -> TaskWrites | None:
    """The writes of one checkpoint, read from where the file ended when it was written.

    ``mark`` is that end (:data:`WritesMark`); only the frames after it are read. None
    when the file no longer has that frame ending there (it was rewritten by a
    deletion, or is damaged) or a frame after it does not check out: the caller then
    reads the whole file. An empty dict when there is no file.
    """
    offset, length, crc = mark
    if offset == 0:  # the file was empty: every frame may be this checkpoint's
        return read_checkpoint_writes(path, ns, checkpoint_id, max_bytes=max_bytes)
    start = offset - FRAME_HEADER.size - length
    if start < 0 or length <= 0:
        return None
    try:
        fd = fsio.open_regular(path)
    except FileNotFoundError:
        return {}
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        if size > max_bytes or size < offset:
            return None
        data = _pread_all(fd, start, size - start)
    finally:
        os.close(fd)
    body_end = FRAME_HEADER_SIZE + length
    if FRAME_HEADER.unpack_from(data, 0) != (length, crc):
        return None
    try:
        next(iter_frames(data, 0, body_end, length, signed=False))  # its crc still checks out
    except BadFrame:
        return None
    return _frames_of(data, body_end, ns, checkpoint_id)


def _frames_of(data: bytes, pos: int, ns: str, checkpoint_id: str) -> TaskWrites | None:
    """The writes of one checkpoint in the frames of ``data`` from ``pos`` on; None when a
    frame does not check out."""
    key = _ENCODER.encode(ns) + _ENCODER.encode(checkpoint_id)
    found: TaskWrites = {}
    at = FRAME_HEADER_SIZE + 1  # a frame body is a 5-array (one header byte), then ns, then id
    try:
        for start, body, _ in iter_frames(data, pos, len(data), len(data), signed=False):
            if data.startswith(key, start + at):
                try:
                    ns_, cid, task_id, task_path, items = _FRAME_HEAD_DECODER.decode(body)
                except msgspec.DecodeError:
                    return None
                if (ns_, cid) == (ns, checkpoint_id):
                    _apply(found, task_id, task_path, _ITEMS_DECODER.decode(items))
    except BadFrame:
        return None
    return found


EMPTY_MARK: WritesMark = (0, 0, 0)
"""The mark of an empty (or missing) writes file."""


def mark_after(mark: WritesMark | None, data: bytes) -> WritesMark | None:
    """The mark of the writes file after appending ``data`` (whole frames) at ``mark``
    (None: not known, and still not)."""
    last = last_frame_header(data)
    if mark is None or last is None:
        return mark
    return (mark[0] + len(data), *last)


def state_mark(state: PendingWrites) -> WritesMark | None:
    """The mark of the writes file as ``state`` parsed it."""
    if state.last is None:
        return EMPTY_MARK if state.offset == 0 else None
    return (state.offset, *state.last)


def open_writes(path: Path, state: PendingWrites, run_id: str) -> int:
    """Open the writes file for appending, cutting a torn tail a crash left behind.

    ``state`` is the file as parsed just before: bytes past its ``offset`` are
    the torn tail.
    """
    existed = path.exists()
    fd = fsio.open_append(path)
    try:
        size = os.fstat(fd).st_size
        if state.ino == os.fstat(fd).st_ino and size > state.offset:
            log.warning(
                "run %s: cutting a torn tail of %d bytes off %s (a crash cut an append)",
                run_id,
                size - state.offset,
                path,
            )
            fsio.truncate(fd, state.offset, path)
        if not existed:
            fsio.fsync_dir(path.parent)
    except BaseException:
        os.close(fd)
        raise
    return fd


def append_writes(fd: int, data: bytes, path: Path) -> None:
    """Append framed writes and fsync them before returning."""
    fsio.write_all(fd, data, path)
    fsio.fsync_fd(fd, path)


def rewrite_writes(
    path: Path,
    by_checkpoint: Mapping[tuple[str, str], TaskWrites],
    keep: set[tuple[str, str]],
) -> None:
    """Replace the writes file atomically with the writes of the checkpoints in ``keep``."""
    if all(key in keep for key in by_checkpoint):
        return
    chunks = []
    for key, writes in by_checkpoint.items():
        if key in keep:
            chunks += encode_writes(key[0], key[1], writes)
    fsio.atomic_write(path, b"".join(chunks))


def _pread_all(fd: int, offset: int, size: int) -> bytes:
    chunks = []
    while size > 0:
        chunk = os.pread(fd, size, offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
        size -= len(chunk)
    return b"".join(chunks)


__all__: Sequence[str] = [
    "WRITES_NAME",
    "CheckpointWrites",
    "PendingWrites",
    "TaskWrites",
    "Typed",
    "WriteFrame",
    "append_writes",
    "encode_writes",
    "open_writes",
    "read_checkpoint_writes",
    "read_writes",
    "rewrite_writes",
]
