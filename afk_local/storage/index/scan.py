"""Reading the ``run.meta`` of a store's runs for its index: a scan of ``runs/``, each
changed meta read (a ``stat`` first), and the mark a deletion leaves.

The lowest part of a :class:`~afk_local.storage.meta_index.MetaIndex`.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from afk_local.errors import AfkLocalError
from afk_local.storage import fsio
from afk_local.storage.format.codec import RecordCodec
from afk_local.storage.format.layout import META_NAME, RunPaths, validate_run_id
from afk_local.storage.format.meta_index_file import UNREADABLE, MetaSummary
from afk_local.storage.rundir.read.reader import read_meta
from afk_local.storage.rundir.run_changes import summarise

log = logging.getLogger("afk_local")

DELETED_NAME = "runs.deleted"
"""An empty file in the store's root, replaced (a new inode) after every run deletion."""


class MetaScan:
    """The runs of one store as their ``run.meta`` files say (the base of its index).

    Args:
        root: the store's root (where ``runs.deleted`` is kept).
        runs_dir: its ``runs/``.
        record_codec: the store's codec (to read a changed ``run.meta``).
    """

    def __init__(self, root: Path, runs_dir: Path, record_codec: RecordCodec) -> None:
        self._root = root
        self._runs_dir = str(runs_dir)
        self._codec = record_codec

    def _deletion_mark(self) -> tuple[int, int] | None:
        """:data:`DELETED_NAME` now (inode, mtime), or None when there is none."""
        try:
            st = os.stat(self._root / DELETED_NAME, follow_symlinks=False)
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
            if not is_run_id(name):
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


class RunsDir:
    """``runs/`` for a sweep: its directories' names, and ``stat`` relative to it (through
    a directory descriptor where the platform has them: a shorter path walk per run)."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._fd: int | None = None

    def __enter__(self) -> RunsDir:
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


def is_run_id(name: str) -> bool:
    """Whether ``name`` is a valid run id (so never a path)."""
    try:
        validate_run_id(name)
    except AfkLocalError:
        return False
    return True
