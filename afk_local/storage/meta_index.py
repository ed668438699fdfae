"""A store's index of its runs' metas: what a listing or a sweep needs to know of each run
without decoding every ``run.meta``.

Each entry summarises one run's ``run.meta`` (status, last update, whether it has an
entrypoint, the watcher's next attempt) together with the file's ``(inode, mtime,
size)``. The index is never the truth: every use stats each run's ``run.meta`` and
decodes the ones whose stat changed (``run.meta`` is only ever replaced by a rename, so
a change always moves the inode), runs that appeared are read, runs that went are
dropped. For a store of 100,000 runs a sweep is then one directory listing and 100,000
``stat`` calls instead of 100,000 decodes.

Stores of :data:`INDEX_MIN_RUNS` runs or more keep it in ``<root>/runs.index`` (msgpack,
bounded when read, replaced all at once and never fsynced: a cache, rebuilt from the
runs whenever it is missing, torn or damaged), so that a new process (the watcher's
first sweep, ``afk-local runs``) starts warm; smaller stores keep it in memory only.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import msgspec

from afk_local.errors import AfkLocalError
from afk_local.storage import fsio
from afk_local.storage.format.codec import RecordCodec
from afk_local.storage.format.layout import META_NAME, RunPaths, validate_run_id
from afk_local.storage.rundir.reader import read_meta

log = logging.getLogger("afk_local")

INDEX_NAME = "runs.index"
"""The index's file in the store's root."""

INDEX_MIN_RUNS = 500
"""Stores with fewer runs do not write the index to disk (reading every meta is cheap)."""

MAX_INDEX_BYTES = 256 << 20
"""The largest index file read (about two million runs)."""

UNREADABLE = ""
"""The status of a run whose ``run.meta`` could not be read (damaged, newer schema...)."""


class MetaSummary(msgspec.Struct, array_like=True, frozen=True):
    """What the index keeps of one run's ``run.meta``, and the stat it was read at."""

    ino: int
    mtime_ns: int
    size: int
    status: str
    """The run's status, or :data:`UNREADABLE`."""
    updated_ms: int
    entrypoint: bool
    """True when the run has an entrypoint (a watcher can resume it)."""
    next_attempt_ms: int

    @property
    def expects_owner(self) -> bool:
        """True for ``created`` and ``running`` (see ``RunStatus.expects_owner``)."""
        return self.status in ("created", "running")


class _IndexFile(msgspec.Struct):
    version: int
    runs: dict[str, MetaSummary]


_VERSION = 1
_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(_IndexFile)


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
        self._saved = False

    def summaries(self) -> dict[str, MetaSummary]:
        """Every run's summary, checked against its ``run.meta`` now (run id -> summary).

        A run directory without a ``run.meta`` is left out; one whose meta cannot be
        read is in it with status :data:`UNREADABLE` (its readers report why).
        """
        old = self._load() if self._runs is None else self._runs
        fresh: dict[str, MetaSummary] = {}
        changed = 0
        runs_dir = self._runs_dir
        try:
            with os.scandir(runs_dir) as entries:
                names = [e.name for e in entries if e.is_dir(follow_symlinks=False)]
        except FileNotFoundError:
            names = []
        for name in names:
            try:
                st = os.stat(f"{runs_dir}/{name}/{META_NAME}", follow_symlinks=False)
            except OSError:
                continue  # being created, or no meta: not a run to list
            known = old.get(name)
            if (
                known is not None
                and known.ino == st.st_ino
                and known.mtime_ns == st.st_mtime_ns
                and known.size == st.st_size
            ):
                fresh[name] = known
                continue
            summary = self._read(name, st)
            if summary is not None:
                fresh[name] = summary
                changed += 1
        if changed or len(fresh) != len(old):
            self._saved = False
        self._runs = fresh
        if not self._saved and len(fresh) >= INDEX_MIN_RUNS:
            self._save(fresh)
        return fresh

    def _read(self, name: str, st: os.stat_result) -> MetaSummary | None:
        try:
            run_id = validate_run_id(name)
        except AfkLocalError:
            return None  # not a run's name (a temporary, something planted)
        try:
            meta = read_meta(RunPaths(run_id, Path(self._runs_dir) / run_id), self._codec)
        except AfkLocalError:
            return MetaSummary(st.st_ino, st.st_mtime_ns, st.st_size, UNREADABLE, 0, False, 0)
        return MetaSummary(
            st.st_ino,
            st.st_mtime_ns,
            st.st_size,
            meta.status.value,
            meta.updated_ms,
            meta.entrypoint is not None,
            meta.next_attempt_ms,
        )

    def _load(self) -> dict[str, MetaSummary]:
        try:
            data = fsio.read_bounded(self.path, MAX_INDEX_BYTES)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.info("%s: not used (%s); rebuilt from the runs", self.path, exc)
            return {}
        try:
            index = _DECODER.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.info("%s: not used (%s); rebuilt from the runs", self.path, exc)
            return {}
        if index.version != _VERSION:
            return {}
        self._saved = True
        return index.runs

    def _save(self, runs: dict[str, MetaSummary]) -> None:
        try:
            fsio.replace_unsynced(self.path, _ENCODER.encode(_IndexFile(_VERSION, runs)))
        except OSError as exc:  # a read-only store lists all the same
            log.debug("%s: not written (%s)", self.path, exc)
            return
        self._saved = True


__all__ = ["INDEX_MIN_RUNS", "INDEX_NAME", "UNREADABLE", "MetaIndex", "MetaSummary"]
