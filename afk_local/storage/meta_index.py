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

from afk_local.errors import AfkLocalError
from afk_local.storage import fsio
from afk_local.storage.dir_stamp import dir_stamp, keeps_dir_times, vouching
from afk_local.storage.format.codec import RecordCodec
from afk_local.storage.format.layout import META_NAME, RunPaths, validate_run_id
from afk_local.storage.format.meta_index_file import (
    UNREADABLE,
    Entry,
    MetaSummary,
    Stamp,
    decode_changes,
    decode_chunk,
    decode_index,
    decode_summaries,
    encode_index,
    listing_order,
)
from afk_local.storage.rundir.read.reader import read_meta
from afk_local.storage.rundir.run_changes import changes_path, summarise

log = logging.getLogger("afk_local")

INDEX_NAME = "runs.index"
"""The index's file in the store's root."""

INDEX_MIN_RUNS = 500
"""Stores with fewer runs do not write the index to disk (reading every meta is cheap)."""

MAX_INDEX_BYTES = 256 << 20
"""The largest index file read (about a million runs)."""

DELETED_NAME = "runs.deleted"
"""An empty file in the store's root, replaced (a new inode) after every run deletion."""

AWAKE = frozenset({"created", "running", "sleeping", UNREADABLE})
"""The statuses of runs a watcher may have to act on (:meth:`MetaIndex.steady_summaries`)."""

RESAVE_AFTER = 256
"""A listing rewrites the index once this many runs came or went since it was written
(fewer are cheaper to read again than the index is to rewrite)."""

MAX_CHANGES_BYTES = 64 << 20
"""The most of ``runs.changes`` read at once (about 500,000 records); past it the file
is not used and is started afresh."""

ROTATE_CHANGES_BYTES = 4 << 20
"""A listing that saves the index starts ``runs.changes`` afresh once this much of it
is in the index."""


class MetaIndex:
    """The index of one store's runs; :meth:`summaries` brings it up to date.

    Not thread-safe; one per :class:`~afk_local.Store` object (a process's sweeps
    share it, so that later sweeps only stat).

    Args:
        root: the store's root (where ``runs.index`` is kept).
        runs_dir: its ``runs/``.
        record_codec: the store's codec (to read a changed ``run.meta``).
    """

    def __init__(self, root: Path, runs_dir: Path, record_codec: RecordCodec) -> None:
        self.path = root / INDEX_NAME
        self._runs_dir = str(runs_dir)
        self._codec = record_codec
        self._runs: dict[str, MetaSummary] | None = None
        """Every run's summary as last checked (by :meth:`summaries`) or loaded."""
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
        """:data:`DELETED_NAME` as it was when every summary was last checked."""
        self._changes_at: tuple[int, int] | None = None
        """``(inode, offset)``: how much of ``runs.changes`` the summaries hold."""
        self._changes_damaged = False
        self._checked_all = False
        """True once :meth:`summaries` checked every run (for :meth:`steady_summaries`)."""
        self._sweep_stamp: Stamp | None = None
        """``runs/`` when :meth:`steady_summaries` last listed it (None: list it again)."""
        self._cursor: list[str] = []
        """The runs the safety slices of :meth:`steady_summaries` have still to check."""
        self._awake: dict[str, MetaSummary] = {}
        """The checked summaries whose status is in :data:`AWAKE`."""
        self._loaded = False
        self._saved = False

    def summaries(self) -> dict[str, MetaSummary]:
        """Every run's summary, checked against its ``run.meta`` now (run id -> summary).

        A run directory without a ``run.meta`` is left out; one whose meta cannot be
        read is in it with status :data:`UNREADABLE` (its readers report why).
        """
        self.catch_up()
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
        self._checked_all, self._sweep_stamp = True, stamp
        self._awake = {name: s for name, s in fresh.items() if s.status in AWAKE}
        self._runs, self._entries, self._chunks = fresh, None, None
        self._made_from(stamp, unlisted)
        if deleted != self._deleted:
            self._deleted, self._saved = deleted, False
        if len(fresh) >= INDEX_MIN_RUNS and (
            not self._saved or (self._stamp is not None and self._stamp != self._file_stamp)
        ):
            self._save()
        return fresh

    def steady_summaries(self, slices: int) -> dict[str, MetaSummary]:
        """The summaries of the runs a watcher may have to act on (status in
        :data:`AWAKE`), checking only what may have changed since the last call: for a
        watcher that sweeps again and again (run id -> summary).

        The first call checks every run (:meth:`summaries`). Later ones check the runs that
        ``runs.changes`` names since (:meth:`catch_up`), the directories that came to or
        left ``runs/`` (listed only when its stamp moved), and the next of ``slices``
        slices of every run: a change that no record tells (a writer killed between its
        meta and its record, a lost record) is found within ``slices`` calls. Checking a
        run is one ``stat`` of its ``run.meta``, and a read when that changed.
        """
        if not self._checked_all:
            self.summaries()
            return self._awake
        names = self.catch_up()
        known = self._known()
        stamp = dir_stamp(self._runs_dir)
        if stamp is None or stamp != self._sweep_stamp:
            listed = set(self._scan())
            names.update(listed.symmetric_difference(known))
            self._sweep_stamp = vouching(stamp)
        if not self._cursor:
            self._cursor = list(known)
        share = min(len(self._cursor), -(-len(known) // max(slices, 1)))
        if share:
            names.update(self._cursor[-share:])
            del self._cursor[-share:]
        changed = False
        with _RunsDir(self._runs_dir) as runs:
            for name in names:
                old = known.get(name)
                try:
                    st = runs.stat(f"{name}/{META_NAME}")
                except OSError:
                    changed |= known.pop(name, None) is not None
                    continue
                if old is not None and (old.ino, old.mtime_ns, old.size) == (
                    st.st_ino,
                    st.st_mtime_ns,
                    st.st_size,
                ):
                    continue  # what it says is what run.meta holds
                try:
                    summary = self._read(name, st, runs.stat(name).st_ino)
                except OSError:
                    summary = None
                if summary is None:
                    changed |= known.pop(name, None) is not None
                else:
                    known[name], changed = summary, True
        awake = self._awake
        for name in names:
            summary = known.get(name)
            if summary is not None and summary.status in AWAKE:
                awake[name] = summary
            else:
                awake.pop(name, None)
        if changed:
            self._entries, self._chunks, self._saved = None, None, False
        return awake

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
            if len(kept) >= INDEX_MIN_RUNS and (
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

    def _deletion_mark(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path.parent / DELETED_NAME, follow_symlinks=False)
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns)

    def _scan(self) -> dict[str, int]:
        """The directories in ``runs/`` (name -> inode), not following symlinks."""
        try:
            with os.scandir(self._runs_dir) as entries:
                return {e.name: e.inode() for e in entries if e.is_dir(follow_symlinks=False)}
        except FileNotFoundError:
            return {}

    def _read_all(self, names: list[str]) -> dict[str, MetaSummary]:
        """The readable ones of ``names`` (directories not in the order), read now."""
        found = {}
        for name in names:
            if not _is_run_id(name):
                continue  # never a path from the file that was not a run's name
            try:
                dir_ino = os.stat(f"{self._runs_dir}/{name}", follow_symlinks=False).st_ino
            except OSError:
                continue
            summary = self._read_now(name, dir_ino)
            if summary is not None and summary.status:
                found[name] = summary
        return found

    def _read_now(self, name: str, dir_ino: int) -> MetaSummary | None:
        try:
            st = os.stat(f"{self._runs_dir}/{name}/{META_NAME}", follow_symlinks=False)
        except OSError:
            return None
        return self._read(name, st, dir_ino)

    def _read(self, name: str, st: os.stat_result, dir_ino: int) -> MetaSummary | None:
        try:
            run_id = validate_run_id(name)
        except AfkLocalError:
            return None  # not a run's name (a temporary, something planted)
        try:
            meta = read_meta(RunPaths(run_id, Path(self._runs_dir) / run_id), self._codec)
        except AfkLocalError:
            return MetaSummary(
                st.st_ino, st.st_mtime_ns, st.st_size, UNREADABLE, 0, False, 0, 0, dir_ino
            )
        return summarise(meta, st, dir_ino)

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

    def catch_up(self) -> set[str]:
        """Take in what the store's writers appended to ``runs.changes`` since the index
        last read it; returns the ids of the runs it names (created, changed or deleted).

        A record only stands for its run while the ``run.meta`` it names keeps the stat
        it carries (every user of a summary compares it, or reads the run itself), and
        reading stops at the first record that cannot be used
        (:func:`~afk_local.storage.format.meta_index_file.decode_changes`): a garbled
        file costs re-reads, never a wrong decision.
        """
        if not self._loaded:
            self._load()
        path = changes_path(self.path.parent)
        try:
            fd = fsio.open_regular(path)
        except FileNotFoundError:
            return set()
        except OSError as exc:
            log.info("%s: not used (%s)", path, exc)
            return set()
        try:
            st = os.fstat(fd)
            at = self._changes_at
            start = at[1] if at is not None and at[0] == st.st_ino and at[1] <= st.st_size else 0
            if st.st_size == start:
                return set()
            if st.st_uid != os.getuid() or st.st_mode & 0o022:
                log.info("%s: not used (owned by uid %d, mode %o)", path, st.st_uid, st.st_mode)
                return set()
            if st.st_size - start > MAX_CHANGES_BYTES:
                log.info("%s: not used (over %d bytes); the runs are read", path, MAX_CHANGES_BYTES)
                self._forget()
                self._changes_at = (st.st_ino, st.st_size)
                return set()
            data = os.pread(fd, st.st_size - start, start)
        finally:
            os.close(fd)
        records, end, problem = decode_changes(data, 0, self._codec.signer)
        if problem is not None:
            # Past a damaged record nothing is read (its offset is kept until the file is
            # started afresh, by the next save): the runs after it are read from their metas.
            log.info("%s: read up to byte %d (%s)", path, start + end, problem)
            self._changes_damaged, self._saved = True, False
        self._changes_at = (st.st_ino, start + end)
        if not records:
            return set()
        known = self._known()
        latest = {change.run_id: change.summary for change in records}  # the newest stands
        known.update({run_id: s for run_id, s in latest.items() if s is not None})
        for run_id in [run_id for run_id, summary in latest.items() if summary is None]:
            known.pop(run_id, None)  # deleted since
        named = set(latest)
        # The order is made again from the summaries when it is needed; the stamp no
        # longer vouches for it.
        self._entries, self._chunks = None, None
        self._stamp, self._saved = None, False
        return named

    def _rotate_changes(self) -> None:
        """Start ``runs.changes`` afresh, keeping what was appended to the old one up to
        the moment it was replaced (an append racing the replace may be lost: its run
        is read from its meta)."""
        path = changes_path(self.path.parent)
        self.catch_up()
        try:
            fsio.replace_unsynced(path, b"")
            self._changes_at = (os.stat(path, follow_symlinks=False).st_ino, 0)
        except OSError as exc:
            log.debug("%s: not started afresh (%s)", path, exc)
            return
        self._changes_damaged = False

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
        if self._changes_damaged or (
            self._changes_at is not None and self._changes_at[1] >= ROTATE_CHANGES_BYTES
        ):
            self._rotate_changes()
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


class _RunsDir:
    """``runs/`` for a sweep: its directories' names, and ``stat`` relative to it (through
    a directory descriptor where the platform has them: a shorter path walk per run)."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._fd: int | None = None

    def __enter__(self) -> _RunsDir:
        if os.stat in os.supports_dir_fd:
            try:
                self._fd = os.open(self._path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
            except OSError:
                self._fd = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)

    def names(self) -> list[str]:
        """The directories in it (not symlinks), or none when it does not exist."""
        try:
            with os.scandir(self._path) as entries:
                return [e.name for e in entries if e.is_dir(follow_symlinks=False)]
        except FileNotFoundError:
            return []

    def stat(self, relative: str) -> os.stat_result:
        """``os.stat`` of ``relative`` inside it, not following a final symlink."""
        if self._fd is not None:
            return os.stat(relative, dir_fd=self._fd, follow_symlinks=False)
        return os.stat(f"{self._path}/{relative}", follow_symlinks=False)


def note_deletion(root: Path, env: fsio.Env | None = None) -> None:
    """Tell the store's listings that a run was deleted (after its directory left
    ``runs/``): the next one checks every run's meta before it trusts the index's order.
    Never fails a deletion (a store that cannot be written lists without an index).
    ``env``: the store's, whose recorder sees the write."""
    try:
        fsio.replace_unsynced(root / DELETED_NAME, b"", env)
    except OSError as exc:
        log.debug("%s: not written (%s)", root / DELETED_NAME, exc)


def _is_run_id(name: str) -> bool:
    try:
        validate_run_id(name)
    except AfkLocalError:
        return False
    return True


__all__ = [
    "DELETED_NAME",
    "INDEX_MIN_RUNS",
    "INDEX_NAME",
    "UNREADABLE",
    "MetaIndex",
    "MetaSummary",
    "note_deletion",
]
