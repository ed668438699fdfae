"""Checking every run a store's index knows against its ``run.meta``: the full check
(:meth:`MetaSweeps.summaries`, for sweeps and filtered listings) and the steady one
(:meth:`MetaSweeps.steady_summaries`, for a watcher that sweeps again and again: only
what may have changed, and the runs it may have to act on).

``run.meta`` is only ever replaced by a rename, so a change always moves its inode: a
run whose ``run.meta`` keeps the stat its summary was read at is not read again. For
100,000 runs: one directory listing and 100,000 ``stat`` calls instead of 100,000
decodes.
"""

from __future__ import annotations

from pathlib import Path

from afk_local.storage.dir_stamp import dir_stamp, vouching
from afk_local.storage.format.codec import RecordCodec
from afk_local.storage.format.layout import META_NAME
from afk_local.storage.format.meta_index_file import UNREADABLE, MetaSummary, Stamp
from afk_local.storage.index.changes import IndexChanges
from afk_local.storage.index.collector import bulk
from afk_local.storage.index.scan import RunsDir

AWAKE = frozenset({"created", "running", "sleeping", UNREADABLE})
"""The statuses of runs a watcher may have to act on (:meth:`MetaSweeps.steady_summaries`)."""


class MetaSweeps(IndexChanges):
    """A store's index, checked against its runs in full or steadily.

    Args:
        root: the store's root (where ``runs.index`` is kept).
        runs_dir: its ``runs/``.
        record_codec: the store's codec (to read a changed ``run.meta``).
    """

    def __init__(self, root: Path, runs_dir: Path, record_codec: RecordCodec) -> None:
        super().__init__(root, runs_dir, record_codec)
        self._checked_all = False
        """True once :meth:`summaries` checked every run (for :meth:`steady_summaries`)."""
        self._sweep_stamp: Stamp | None = None
        """``runs/`` when :meth:`steady_summaries` last listed it (None: list it again)."""
        self._cursor: list[str] = []
        """The runs the safety slices of :meth:`steady_summaries` have still to check."""
        self._awake: dict[str, MetaSummary] = {}
        """The checked summaries whose status is in :data:`AWAKE`."""

    @bulk
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
        with RunsDir(self._runs_dir) as runs:
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
        if self._worth_a_file(len(fresh)) and (
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
        with RunsDir(self._runs_dir) as runs:
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
