"""Catching a store's meta index up from ``runs.changes``: the summary of each
``run.meta`` the store's writers wrote, or each run they deleted, appended as they go
(:mod:`afk_local.storage.rundir.run_changes`), so that a listing or a sweep learns what
changed without a ``stat`` of every run. The file is started afresh when the index is
saved past :data:`ROTATE_CHANGES_BYTES`, or past a damaged record.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from afk_local.storage import fsio
from afk_local.storage.format.codec import RecordCodec
from afk_local.storage.format.meta_index_file import decode_changes
from afk_local.storage.index.collector import bulk
from afk_local.storage.index.index_file import StoredIndex
from afk_local.storage.rundir.run_changes import changes_path

log = logging.getLogger("afk_local")

MAX_CHANGES_BYTES = 64 << 20
"""The most of ``runs.changes`` read at once (about 500,000 records); past it the file
is not used and is started afresh."""

ROTATE_CHANGES_BYTES = 4 << 20
"""A listing that saves the index starts ``runs.changes`` afresh once this much of it
is in the index."""


class IndexChanges(StoredIndex):
    """A store's index that takes in ``runs.changes`` (:meth:`catch_up`).

    Args:
        root: the store's root (where ``runs.index`` and ``runs.changes`` are kept).
        runs_dir: its ``runs/``.
        record_codec: the store's codec (to read a changed ``run.meta``, to check
            signed records).
    """

    def __init__(self, root: Path, runs_dir: Path, record_codec: RecordCodec) -> None:
        super().__init__(root, runs_dir, record_codec)
        self._changes_damaged = False

    @bulk
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

    def _save(self) -> None:
        """Start ``runs.changes`` afresh when it is damaged or has grown past
        :data:`ROTATE_CHANGES_BYTES`, then write the index (the offset it holds is the
        new file's)."""
        if self._changes_damaged or (
            self._changes_at is not None and self._changes_at[1] >= ROTATE_CHANGES_BYTES
        ):
            self._rotate_changes()
        super()._save()

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
