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

from afk_local.storage.dir_stamp import dir_stamp, keeps_dir_times, vouching
from afk_local.storage.format.layout import META_NAME
from afk_local.storage.format.meta_index_file import (
    UNREADABLE,
    Entry,
    MetaSummary,
    Stamp,
    listing_order,
)
from afk_local.storage.index.changes import MAX_CHANGES_BYTES, ROTATE_CHANGES_BYTES
from afk_local.storage.index.collector import bulk
from afk_local.storage.index.index_file import INDEX_MIN_RUNS, INDEX_NAME, MAX_INDEX_BYTES
from afk_local.storage.index.scan import DELETED_NAME, is_run_id, note_deletion
from afk_local.storage.index.sweeps import AWAKE, MetaSweeps

log = logging.getLogger("afk_local")

RESAVE_AFTER = 256
"""A listing rewrites the index once this many runs came or went since it was written
(fewer are cheaper to read again than the index is to rewrite)."""


class MetaIndex(MetaSweeps):
    """The index of one store's runs; :meth:`summaries` brings it up to date, and
    :meth:`newest_first` lists them.

    Built on its parts (``afk_local/storage/index/``): ``MetaScan`` (``runs/`` and each
    ``run.meta``) <- ``StoredIndex`` (``runs.index``: load, save, the listing order it
    holds) <- ``IndexChanges`` (catching up from ``runs.changes``) <- ``MetaSweeps``
    (the full and the steady check) <- ``MetaIndex`` (the listing order).

    Not thread-safe; one per :class:`~afk_local.Store` object (a process's sweeps
    share it, so that later sweeps only stat).

    Args:
        root: the store's root (where ``runs.index`` is kept).
        runs_dir: its ``runs/``.
        record_codec: the store's codec (to read a changed ``run.meta``).
    """

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
        self.catch_up()
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
                if entry[1] not in yielded and is_run_id(entry[1]):  # not a path: checked
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

    @bulk
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
            if self._worth_a_file(len(kept)) and (
                not self._saved or (stamp is not None and stamp != self._file_stamp)
            ):  # records of runs.changes taken in, or a stamp that vouches now
                self._save()
            return kept, {}
        known = self._known()
        runs = {e[1]: known[e[1]] for e in kept if e[1] in known}
        runs.update(came)
        entries = list(heapq.merge(kept, listing_order(readable), reverse=True))
        self._runs, self._entries, self._chunks, self._saved = runs, entries, None, False
        self._made_from(stamp, unlisted)
        if self._worth_a_file(len(runs)) and (
            moved >= RESAVE_AFTER or (self._stamp is not None and self._stamp != self._file_stamp)
        ):
            self._save()
        return entries, {}


__all__ = [
    "AWAKE",
    "DELETED_NAME",
    "INDEX_MIN_RUNS",
    "INDEX_NAME",
    "MAX_CHANGES_BYTES",
    "MAX_INDEX_BYTES",
    "RESAVE_AFTER",
    "ROTATE_CHANGES_BYTES",
    "UNREADABLE",
    "MetaIndex",
    "MetaSummary",
    "note_deletion",
]
