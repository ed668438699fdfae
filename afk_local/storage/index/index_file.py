"""``runs.index``, the file a store's meta index is kept in: the summaries and the
listing order it holds, loaded once (each part kept undecoded until it is needed), and
saved; what it says that the runs do not (``afk-local verify``).

Stores of :data:`INDEX_MIN_RUNS` runs or more keep the file (msgpack, bounded when read,
replaced all at once and never fsynced: a cache, rebuilt from the runs whenever it is
missing, torn or damaged), so that a new process starts warm; smaller stores keep the
index in memory only. docs/format.md describes the file.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

from afk_local.storage import fsio
from afk_local.storage.format.codec import RecordCodec
from afk_local.storage.format.layout import META_NAME
from afk_local.storage.format.meta_index_file import (
    Entry,
    MetaSummary,
    Stamp,
    decode_chunk,
    decode_index,
    decode_summaries,
    encode_index,
    listing_order,
)
from afk_local.storage.index.collector import bulk
from afk_local.storage.index.scan import MetaScan, is_run_id

log = logging.getLogger("afk_local")

INDEX_NAME = "runs.index"
"""The index's file in the store's root."""

INDEX_MIN_RUNS = 500
"""Stores with fewer runs do not write the index to disk (reading every meta is cheap)."""

MAX_INDEX_BYTES = 256 << 20
"""The largest index file read (about a million runs)."""


class StoredIndex(MetaScan):
    """What a store's index holds (summaries, listing order, the stamp of ``runs/`` it
    was made from) and the file it is kept in.

    Args:
        root: the store's root (where ``runs.index`` is kept).
        runs_dir: its ``runs/``.
        record_codec: the store's codec (to read a changed ``run.meta``, to sign the file).
    """

    def __init__(self, root: Path, runs_dir: Path, record_codec: RecordCodec) -> None:
        super().__init__(root, runs_dir, record_codec)
        self.path = root / INDEX_NAME
        self._runs: dict[str, MetaSummary] | None = None
        """Every run's summary as last checked (by ``summaries``) or loaded."""
        self._raw_runs: bytes | None = None
        """The file's undecoded summaries, until one is needed."""
        self._entries: list[Entry] | None = None
        """The listing order of the runs :attr:`_runs` holds, once known."""
        self._chunks: list[bytes] | None = None
        """The file's undecoded listing order, until all of it is needed."""
        self._stamp: Stamp | None = None
        """``runs/`` as it was when the order and :attr:`_unlisted` were made (None:
        unknown, or a stamp that could not vouch for its names)."""
        self._unlisted: list[str] = []
        self._file_stamp: Stamp | None = None
        self._deleted: tuple[int, int] | None = None
        """``runs.deleted`` as it was when every summary was last checked."""
        self._changes_at: tuple[int, int] | None = None
        """``(inode, offset)``: how much of ``runs.changes`` the summaries hold."""
        self._loaded = False
        self._saved = False

    @staticmethod
    def _worth_a_file(runs: int) -> bool:
        """Whether a store of ``runs`` runs keeps its index on disk."""
        return runs >= INDEX_MIN_RUNS

    def _made_from(self, stamp: Stamp | None, unlisted: list[str]) -> None:
        """Record that the order was made from a listing of ``runs/`` taken after it was
        ``stamp`` (None: a stamp that cannot vouch, see :func:`.dir_stamp.vouching`), and which of
        its directories it left out."""
        self._stamp = stamp
        self._unlisted = unlisted

    def _known(self) -> dict[str, MetaSummary]:
        """The summaries as last checked or loaded (unchecked: compare their stats)."""
        if self._runs is None:
            if not self._loaded:
                self._load()
            if self._raw_runs is not None:
                try:
                    self._runs = decode_summaries(self._raw_runs)
                except ValueError as exc:
                    log.info("%s: not used (%s); rebuilt from the runs", self.path, exc)
                    self._forget()
                self._raw_runs = None
        if self._runs is None:
            self._runs = {}
        return self._runs

    def _has_order(self) -> bool:
        if self._entries is None and self._chunks is None and not self._loaded:
            self._load()
        # Summaries (from the file, runs.changes or the runs) hold each run's creation
        # time and directory: the order is made from them.
        return self._entries is not None or self._chunks is not None or self._runs is not None

    def _order_or_empty(self) -> list[Entry]:
        """The whole listing order (decoding every chunk left)."""
        if self._entries is None:
            if self._chunks is not None:
                self._entries = list(self._lazy_entries())
                self._chunks = None
            else:
                self._entries = listing_order(self._known())
        return self._entries

    def _lazy_entries(self) -> Iterator[Entry]:
        """The listing order, decoding the file's chunks as they are reached.

        Raises:
            ValueError: a chunk is torn or out of order (each is checked whole before
                any of it is yielded).
        """
        if self._chunks is None:
            yield from self._order_or_empty()
            return
        last: Entry | None = None
        for raw in self._chunks:
            entries = decode_chunk(raw, last)
            if entries:
                last = entries[-1]
            yield from entries

    @bulk
    def _load(self) -> None:
        """Read the file once: its order and summaries, kept undecoded until needed."""
        self._loaded = True
        try:
            st = os.stat(self.path, follow_symlinks=False)
            if st.st_uid != os.getuid() or st.st_mode & 0o022:
                raise OSError(f"owned by uid {st.st_uid}, mode {st.st_mode & 0o777:o}")
            data = fsio.read_bounded(self.path, MAX_INDEX_BYTES)
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.info("%s: not used (%s); rebuilt from the runs", self.path, exc)
            return
        try:
            index = decode_index(data, self._codec.signer)
        except ValueError as exc:
            log.info("%s: not used (%s); rebuilt from the runs", self.path, exc)
            return
        self._chunks = index.order
        self._raw_runs = index.runs
        self._stamp = self._file_stamp = index.stamp
        self._unlisted = index.unlisted
        self._deleted = index.deleted
        self._changes_at = index.changes
        self._saved = True

    def _forget(self) -> None:
        """Drop what the file said: the next look reads every run."""
        self._runs = self._entries = self._chunks = self._raw_runs = None
        self._stamp, self._unlisted, self._saved, self._deleted = None, [], False, None
        self._loaded = True

    def _save(self) -> None:
        """Write what the index holds now (a failure is logged: the file is a cache)."""
        runs = self._known()
        order = self._order_or_empty()
        data = encode_index(
            self._stamp,
            self._unlisted,
            order,
            runs,
            self._deleted,
            changes=self._changes_at,
            signer=self._codec.signer,
        )
        try:
            fsio.replace_unsynced(self.path, data)
        except OSError as exc:  # a read-only store lists all the same
            log.debug("%s: not written (%s)", self.path, exc)
            return
        self._saved, self._file_stamp = True, self._stamp

    def disagreements(self) -> tuple[list[str], list[str]]:
        """What ``runs.index`` on disk says that its runs do not (for ``afk-local verify``):
        ``(notes, problems)``.

        A file that is not used (damaged, of another version, its digest wrong) is a note:
        listings rebuild it. A summary the file vouches for (the stat it names is the one
        ``run.meta`` has now) that differs from the run is a problem: a sweep would have
        trusted it. Reads the file afresh; changes nothing.
        """
        try:
            data = fsio.read_bounded(self.path, MAX_INDEX_BYTES)
        except FileNotFoundError:
            return [], []
        except (OSError, ValueError) as exc:
            return [f"{self.path}: not used ({exc}); rebuilt from the runs"], []
        try:
            runs = decode_summaries(decode_index(data, self._codec.signer).runs)
        except ValueError as exc:
            return [f"{self.path}: not used ({exc}); rebuilt from the runs"], []
        problems = []
        for name, summary in sorted(runs.items()):
            if not is_run_id(name):
                problems.append(f"{self.path}: names {name!r}, which is not a run id")
                continue
            try:
                st = os.stat(f"{self._runs_dir}/{name}/{META_NAME}", follow_symlinks=False)
                dir_ino = os.stat(f"{self._runs_dir}/{name}", follow_symlinks=False).st_ino
            except OSError:
                continue  # gone since: the next listing drops it
            if (summary.ino, summary.mtime_ns, summary.size) != (
                st.st_ino,
                st.st_mtime_ns,
                st.st_size,
            ):
                continue  # changed since: the next listing reads it again
            actual = self._read(name, st, dir_ino)
            if actual is not None and actual != summary:
                problems.append(
                    f"{self.path}: says run {name} is {summary.status or 'unreadable'!r} "
                    f"(updated_ms {summary.updated_ms}), its run.meta says "
                    f"{actual.status or 'unreadable'!r} (updated_ms {actual.updated_ms}); "
                    "delete the file (a cache) and look for what wrote it"
                )
        return [], problems
