"""A store's index of its runs' metas: what a listing or a sweep needs to know of each run
without decoding every ``run.meta``.

Each entry summarises one run's ``run.meta`` (status, creation and last update, whether
it has an entrypoint, the watcher's next attempt) together with the file's ``(inode,
mtime, size)`` and the run directory's inode. The index is never the truth:

- :meth:`MetaIndex.summaries` (sweeps, filtered listings) stats each run's ``run.meta``
  and decodes the ones whose stat changed (``run.meta`` is only ever replaced by a
  rename, so a change always moves the inode); runs that appeared are read, runs that
  went are dropped. For 100,000 runs: one directory listing and 100,000 ``stat`` calls
  instead of 100,000 decodes.
- :meth:`MetaIndex.newest_first` (listings, newest created first) stats no run it
  knows: a run's creation time never changes, so the order of the runs the index
  knows holds as long as each is in the directory it was read in (its inode, which a
  directory listing gives for free). Runs in a new or another directory are read; runs
  that went are dropped. And when ``runs/`` itself has not changed since the order was
  made (the same inode, mtime and ctime: every run created, renamed or deleted changes
  them), not even the directory is listed. A run deleted and created again under its
  id may get the old directory's inode number, so every deletion replaces
  :data:`DELETED_NAME` (:func:`note_deletion`) and the next listing checks every run's
  meta first. Whatever a listing then shows it reads from the run itself, so a status
  is never older than the listing.

Stores of :data:`INDEX_MIN_RUNS` runs or more keep it in ``<root>/runs.index`` (msgpack,
bounded when read, replaced all at once and never fsynced: a cache, rebuilt from the
runs whenever it is missing, torn or damaged), so that a new process (the watcher's
first sweep, ``afk-local runs``) starts warm; smaller stores keep it in memory only.
The file keeps the listing order in chunks apart from the summaries, so a listing
decodes only the chunks it shows. docs/format.md describes the file.
"""

from __future__ import annotations

import heapq
import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from afk_local.storage import fsio
from afk_local.storage.dir_stamp import dir_stamp, keeps_dir_times, vouching
from afk_local.storage.format.layout import META_NAME
from afk_local.storage.format.meta_index_file import (
    UNREADABLE,
    Entry,
    MetaSummary,
    Stamp,
    decode_chunk,
    decode_index,
    decode_summaries,
    encode_index,
    listing_order,
)
from afk_local.storage.meta_scan import DELETED_NAME, INDEX_NAME, MetaScan, _is_run_id, _RunsDir

log = logging.getLogger("afk_local")


INDEX_MIN_RUNS = 500
"""Stores with fewer runs do not write the index to disk (reading every meta is cheap)."""

MAX_INDEX_BYTES = 256 << 20
"""The largest index file read (about a million runs)."""


RESAVE_AFTER = 256
"""A listing rewrites the index once this many runs came or went since it was written
(fewer are cheaper to read again than the index is to rewrite)."""


class MetaIndex(MetaScan):
    """The index of one store's runs; :meth:`summaries` brings it up to date.

    Not thread-safe; one per :class:`~afk_local.Store` object (a process's sweeps
    share it, so that later sweeps only stat).

    Args:
        root: the store's root (where ``runs.index`` is kept).
        runs_dir: its ``runs/``.
        record_codec: the store's codec (to read a changed ``run.meta``).
    """

    def summaries(self) -> dict[str, MetaSummary]:
        """Every run's summary, checked against its ``run.meta`` now (run id -> summary).

        A run directory without a ``run.meta`` is left out; one whose meta cannot be
        read is in it with status :data:`UNREADABLE` (its readers report why).
        """
        old = self._known()
        fresh: dict[str, MetaSummary] = {}
        changed = 0
        deleted = self._deletion_mark()  # before runs/ is listed: a later deletion shows
        stamp = vouching(dir_stamp(self._runs_dir))
        unlisted = []  # directories left out of the listing order
        with _RunsDir(self._runs_dir) as runs:
            for name in runs.names():
                try:
                    st = runs.stat(f"{name}/{META_NAME}")
                except OSError:
                    unlisted.append(name)
                    continue  # being created, or no meta: not a run to list
                known = old.get(name)
                if (
                    known is not None
                    and known.ino == st.st_ino
                    and known.mtime_ns == st.st_mtime_ns
                    and known.size == st.st_size
                ):  # run.meta is replaced by rename only: the same file, the same run
                    fresh[name] = known
                    continue
                try:
                    summary = self._read(name, st, runs.stat(name).st_ino)
                except OSError:
                    summary = None  # gone since
                if summary is not None:
                    fresh[name] = summary
                    changed += 1
                if summary is None or not summary.status:
                    unlisted.append(name)
        if changed or len(fresh) != len(old):
            self._saved = False
        self._runs, self._entries, self._chunks = fresh, None, None
        self._made_from(stamp, unlisted)
        if deleted != self._deleted:
            self._deleted, self._saved = deleted, False
        if len(fresh) >= INDEX_MIN_RUNS and (
            not self._saved or (self._stamp is not None and self._stamp != self._file_stamp)
        ):
            self._save()
        return fresh

    def newest_first(self) -> Iterator[str]:
        """Ids of the runs with a readable ``run.meta``, newest created first (ties: the
        greater id first), without a ``stat`` of the runs the index knows.

        A run the index does not know, or whose directory is not the one it knows, is
        read before the first id comes; the others are ordered by the creation time
        the index holds. ``runs/`` is listed once, or not at all when it has not
        changed since the index's order was made. A run that went since is not
        yielded; one that goes while the caller iterates may still be (reading it
        then fails, as for any run deleted under a reader).
        """
        if not self._has_order() or self._deletion_mark() != self._deleted:
            # No index yet (every run read once), or a run was deleted since every
            # summary was checked: one it knows may have been created again under its
            # id in a directory that got the old one's inode number (ext4 and xfs reuse
            # them), so each run's meta is checked again.
            self.summaries()
        stamp = dir_stamp(self._runs_dir)
        yielded: set[str] = set()  # each once, whatever a damaged file repeats
        if stamp is not None and stamp == self._stamp and keeps_dir_times(stamp[0]):
            # No run came or went since the order was made.
            came = self._read_all(self._unlisted)
            entries: Iterable[Entry] = self._lazy_entries()
        else:
            entries, came = self._rescan(vouching(stamp))
        try:
            for entry in heapq.merge(entries, listing_order(came), reverse=True):
                if entry[1] not in yielded and _is_run_id(entry[1]):  # not a path: checked
                    yielded.add(entry[1])
                    yield entry[1]
        except ValueError as exc:  # a damaged chunk, found only now that it is reached
            log.info("%s: not used (%s); rebuilt from the runs", self.path, exc)
            self._forget()
            self.summaries()
            for entry in self._order_or_empty():
                if entry[1] not in yielded:
                    yield entry[1]

    def summary(self, run_id: str) -> MetaSummary | None:
        """The index's summary of ``run_id`` when its ``run.meta`` still has the stat it
        was read at (one ``stat``), else None (unknown, changed or gone)."""
        known = self._known().get(run_id)
        if known is None:
            return None
        try:
            st = os.stat(f"{self._runs_dir}/{run_id}/{META_NAME}", follow_symlinks=False)
        except OSError:
            return None
        if (known.ino, known.mtime_ns, known.size) != (st.st_ino, st.st_mtime_ns, st.st_size):
            return None
        return known

    def _rescan(self, stamp: Stamp | None) -> tuple[list[Entry], dict[str, MetaSummary]]:
        """List ``runs/``: the known runs still in their directory, and the others read
        (``stamp``: ``runs/``'s, taken just before, if it may vouch for what is listed)."""
        try:
            order = self._order_or_empty()
        except ValueError as exc:
            log.info("%s: not used (%s); rebuilt from the runs", self.path, exc)
            self._forget()
            self.summaries()
            order = self._order_or_empty()
        names = self._scan()
        kept: list[Entry] = []
        for entry in order:
            if names.get(entry[1]) == entry[2]:  # the same directory: the same run
                del names[entry[1]]
                kept.append(entry)
        came = {}  # new runs, and runs in another directory now
        for name, dir_ino in names.items():
            summary = self._read_now(name, dir_ino)
            if summary is not None:
                came[name] = summary
        readable = {name: s for name, s in came.items() if s.status}
        moved = len(readable) + len(order) - len(kept)
        unlisted = [name for name in names if name not in readable]
        if not moved:
            if stamp != self._stamp:  # the same runs: the order may vouch for them now
                self._made_from(stamp, unlisted)
                if len(kept) >= INDEX_MIN_RUNS and stamp is not None and stamp != self._file_stamp:
                    self._save()
            return kept, {}
        known = self._known()
        runs = {e[1]: known[e[1]] for e in kept if e[1] in known}
        runs.update(came)
        entries = list(heapq.merge(kept, listing_order(readable), reverse=True))
        self._runs, self._entries, self._chunks, self._saved = runs, entries, None, False
        self._made_from(stamp, unlisted)
        if len(runs) >= INDEX_MIN_RUNS and (
            moved >= RESAVE_AFTER or (self._stamp is not None and self._stamp != self._file_stamp)
        ):
            self._save()
        return entries, {}

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
        return self._entries is not None or self._chunks is not None

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
        self._saved = True

    def _forget(self) -> None:
        """Drop what the file said: the next look reads every run."""
        self._runs = self._entries = self._chunks = self._raw_runs = None
        self._stamp, self._unlisted, self._saved, self._deleted = None, [], False, None
        self._loaded = True

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
            if not _is_run_id(name):
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

    def _save(self) -> None:
        """Write what the index holds now (a failure is logged: the file is a cache)."""
        runs = self._known()
        order = self._order_or_empty()
        data = encode_index(
            self._stamp, self._unlisted, order, runs, self._deleted, signer=self._codec.signer
        )
        try:
            fsio.replace_unsynced(self.path, data)
        except OSError as exc:  # a read-only store lists all the same
            log.debug("%s: not written (%s)", self.path, exc)
            return
        self._saved, self._file_stamp = True, self._stamp


def note_deletion(root: Path, env: fsio.Env | None = None) -> None:
    """Tell the store's listings that a run was deleted (after its directory left
    ``runs/``): the next one checks every run's meta before it trusts the index's order.
    Never fails a deletion (a store that cannot be written lists without an index).
    ``env``: the store's, whose recorder sees the write."""
    try:
        fsio.replace_unsynced(root / DELETED_NAME, b"", env)
    except OSError as exc:
        log.debug("%s: not written (%s)", root / DELETED_NAME, exc)


__all__ = [
    "DELETED_NAME",
    "INDEX_MIN_RUNS",
    "INDEX_NAME",
    "UNREADABLE",
    "MetaIndex",
    "MetaSummary",
    "note_deletion",
]
