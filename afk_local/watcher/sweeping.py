"""Finding the runs a watcher should resume: interrupted, resumable, trusted, not backing off.

The store's meta index (:class:`~afk_local.storage.meta_index.MetaIndex`) says, with a
``stat`` per run it checks, which metas may need a look; every run it names is then read
from its own ``run.meta`` and its lock probed before anything is decided. A *full* sweep
checks every run's meta; a *steady* one (:meth:`~.MetaIndex.steady_summaries`) only the
runs that ``runs.changes`` names, the directories that came or went, and a slice of the
others, so that a change nothing told is still found within ``slices`` sweeps.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from afk_local.errors import (
    AfkLocalError,
    CheckpointCorruptionError,
    SchemaVersionError,
)
from afk_local.runner.code.origin import cannot_resume
from afk_local.storage.format.records import RunMeta, RunStatus, now_ms
from afk_local.storage.meta_index import UNREADABLE
from afk_local.storage.rundir.mirror import fenced_reason
from afk_local.storage.rundir.ownership import is_interrupted, probe_owner
from afk_local.storage.rundir.read.reader import read_meta
from afk_local.storage.store import Store
from afk_local.storage.trust import require_trusted_run
from afk_local.watcher.wakeups import due_to_wake


class SweepHost(Protocol):
    """What finding interrupted runs needs of the :class:`~afk_local.watcher.watcher.Watcher`."""

    @property
    def store(self) -> Store:
        """The watched store."""

    @property
    def children(self) -> Mapping[str, object]:
        """The runs being resumed right now, by run id (never swept)."""

    def emit(self, kind: str, run_id: str | None = None, message: str = "", **fields: Any) -> None:
        """Report an event."""

    def logs_dir(self, run_id: str) -> Path:
        """``runs/<id>/logs``, made if missing (raises when it cannot be trusted)."""


@dataclass
class _Cached:
    key: tuple[int, int, int]
    meta: RunMeta


class Sweeper:
    """The runs of one store a watcher should resume now, each said about once.

    Args:
        host: the watcher (its store, children and events).
        slices: a steady sweep checks one in ``slices`` of the runs nothing told of.
    """

    def __init__(self, host: SweepHost, *, slices: int) -> None:
        self.host = host
        self.slices = slices
        self._cache: dict[str, _Cached] = {}
        self._skipped: dict[str, str] = {}  # run id -> why it cannot be resumed (said once)
        self._damaged: dict[str, str] = {}  # run id -> the lock problem already reported
        self._reported: dict[str, tuple[int, ...]] = {}  # refused/skipped, by _state_key

    def meta(self, run_id: str) -> RunMeta | None:
        """``run.meta`` of a run, decoded only when its file changed since the last sweep."""
        paths = self.host.store.paths(run_id)
        try:
            st = os.stat(paths.meta, follow_symlinks=False)
        except OSError:
            self._cache.pop(run_id, None)
            return None
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        cached = self._cache.get(run_id)
        if cached is not None and cached.key == key:
            return cached.meta
        reported = self._reported.get(run_id)
        if reported is not None and reported == self._state_key(run_id):
            return None  # refused or unreadable, and unchanged since: said so already
        try:
            meta = read_meta(paths, self.host.store.codec)
        except (SchemaVersionError, CheckpointCorruptionError) as exc:
            # A newer schema, or damaged (keyed: unsigned) meta: said once, left alone.
            self._cache.pop(run_id, None)
            self._report(run_id, "skipped", f"{exc}; the watcher leaves it alone")
            return None
        except AfkLocalError:
            self._cache.pop(run_id, None)
            return None
        self._cache[run_id] = _Cached(key, meta)
        return meta

    def forget(self, run_id: str) -> None:
        """Drop the cached ``run.meta`` of ``run_id``: it changed (or is about to)."""
        self._cache.pop(run_id, None)

    def _report(self, run_id: str, kind: str, message: str) -> None:
        self._reported[run_id] = self._state_key(run_id)
        self.host.emit(kind, run_id, message)

    def _state_key(self, run_id: str) -> tuple[int, ...]:
        """What must change for a refused run to be looked at again: its ``run.meta``
        (``--trust``, a new attempt) or its directory (``chmod``, ``chown``)."""
        paths = self.host.store.paths(run_id)
        key: list[int] = []
        for path in (paths.meta, paths.dir):
            try:
                st = os.stat(path, follow_symlinks=False)
                key += [st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_mode]
            except OSError:
                key += [0, 0, 0, 0, 0]
        return tuple(key)

    def trusted(self, run_id: str) -> bool:
        """Run the trust gate on ``run_id`` before starting anything for it.

        A refusal is reported once (per version of the run's meta) and the run is
        left alone; the watcher goes on with the others.
        """
        try:
            require_trusted_run(self.host.store, run_id, from_origin=True)
            self.host.logs_dir(run_id)
        except (AfkLocalError, OSError) as exc:
            self.forget(run_id)
            self._report(run_id, "refused", f"nothing started: {exc}")
            return False
        return True

    def interrupted(self, now: int | None = None, *, full: bool = True) -> list[str]:
        """Runs a watcher should resume now: interrupted, resumable, not backing off
        (see :meth:`afk_local.watcher.watcher.Watcher.interrupted`); ``full``: every
        run's meta checked, else a steady sweep (see the module doc)."""
        stamp = now_ms() if now is None else now
        found = []
        index = self.host.store.meta_index()
        summaries = index.summaries() if full else index.steady_summaries(self.slices)
        # A run that needs no owner and is not sleeping, or has no entrypoint, is never
        # decoded here.
        sleeping = RunStatus.SLEEPING.value
        children = self.host.children
        candidates = sorted(
            run_id
            for run_id, summary in summaries.items()
            if run_id not in children
            and (
                summary.status == UNREADABLE
                or (
                    (summary.expects_owner or summary.status == sleeping)
                    and summary.entrypoint
                    and summary.next_attempt_ms <= stamp
                )
            )
        )
        for run_id in candidates:
            if self._resumable(run_id, stamp):
                found.append(run_id)
        return found

    def _resumable(self, run_id: str, stamp: int) -> bool:
        meta = self.meta(run_id)
        if meta is None or meta.entrypoint is None:
            return False
        waking = due_to_wake(meta, stamp)  # a parked run whose ctx.sleep is over
        if not (meta.status.expects_owner or waking) or meta.next_attempt_ms > stamp:
            return False
        owner = probe_owner(self.host.store.paths(run_id).lock)
        if owner.problem is not None:
            self._report_damage(run_id, owner.problem)
            return False
        self._damaged.pop(run_id, None)
        if not (is_interrupted(meta.status, owner) or (waking and not owner.held)):
            return False
        reason = cannot_resume(meta) or fenced_reason(self.host.store.paths(run_id))
        if reason is not None:  # knowable now: no doomed attempts, never marked failed
            if self._skipped.get(run_id) != reason:
                self._skipped[run_id] = reason
                self.host.emit("skipped", run_id, f"cannot be resumed: {reason}")
            return False
        self._skipped.pop(run_id, None)
        return True

    def _report_damage(self, run_id: str, problem: str) -> None:
        if self._damaged.get(run_id) == problem:
            return  # said already; a person has to act
        self._damaged[run_id] = problem
        self.host.emit(
            "damaged",
            run_id,
            f"{problem}: not resumed; remove it once no process uses the run "
            f"(`afk-local verify {run_id}`)",
        )


__all__ = ["SweepHost", "Sweeper"]
