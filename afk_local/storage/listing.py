"""What a store lists: the :class:`~afk_local.storage.views.run_info.RunInfo` of a run,
and its runs filtered and newest created first.

A run is listed from its meta, its latest checkpoint, its lock and the bytes in its
directory; a run being created or with a damaged meta is left out (``afk-local
verify`` reports it). :class:`~afk_local.Store` holds the public methods.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from afk_local.errors import AfkLocalError, RunNotFoundError, run_failure
from afk_local.storage.format.layout import META_NAME, RunPaths, parse_pack_name
from afk_local.storage.format.records import Checkpoint, RunMeta, RunStatus
from afk_local.storage.meta_index import MetaIndex
from afk_local.storage.rundir.ownership import is_interrupted, probe_owner
from afk_local.storage.rundir.read.reader import RunReader

log = logging.getLogger("afk_local")

# The views are imported where they are used: a process that only reads a run never
# pays for them.
if TYPE_CHECKING:
    from afk_local.storage.views.run_filter import RunFilter
    from afk_local.storage.views.run_info import RunInfo, RunList


class ListedStore(Protocol):
    """What a listing needs of a store (:class:`afk_local.Store` is one)."""

    def open(self, run_id: str, *, lazy: bool = False) -> RunReader:
        """A read-only view of a run."""
        ...

    def run_ids(self) -> list[str]:
        """Ids of every run directory, sorted."""
        ...

    def read_meta(self, run_id: str) -> RunMeta:
        """The ``run.meta`` of a run."""
        ...

    def info(self, run_id: str) -> RunInfo:
        """The :class:`RunInfo` of one run."""
        ...

    def paths(self, run_id: str, *, refuse_links: bool = False) -> RunPaths:
        """The paths of a run."""
        ...

    def meta_index(self) -> MetaIndex:
        """The index of the store's runs' metas."""
        ...


def run_info(store: ListedStore, run_id: str) -> RunInfo:
    """The :class:`RunInfo` of one run (see :meth:`afk_local.Store.info`)."""
    from afk_local.storage.views.run_info import RunInfo, tags_of  # noqa: PLC0415
    from afk_local.storage.views.run_progress import progress_of  # noqa: PLC0415

    reader = store.open(run_id)
    meta = reader.meta
    damage: str | None
    try:
        latest = reader.latest()
    except AfkLocalError as exc:  # a crafted chain past its decode budget
        latest, damage = None, str(exc)
    else:
        damage = newest_unreadable(reader, latest)
    owner = probe_owner(reader.paths.lock)
    size = 0
    try:
        entries = os.scandir(reader.paths.dir)
    except FileNotFoundError:  # deleted since it was opened, as a reader's catalog says
        raise RunNotFoundError(run_id, str(reader.paths.dir.parent.parent)) from None
    with entries:
        for entry in entries:
            with contextlib.suppress(OSError):
                if entry.is_file(follow_symlinks=False):
                    size += entry.stat(follow_symlinks=False).st_size
    return RunInfo(
        run_id=run_id,
        status=meta.status,
        step=latest.step if latest else 0,
        phase=latest.phase if latest else None,
        seq=latest.seq if latest else 0,
        updated_ms=max(meta.updated_ms, latest.timestamp_ms if latest else 0),
        owner_alive=owner.held,
        bytes=size,
        thread_id=meta.thread_id,
        parent_run_id=meta.parent_run_id,
        entrypoint=meta.entrypoint,
        attempt=meta.attempt,
        created_ms=meta.created_ms,
        tags=tags_of(meta.extra),
        progress=progress_of(latest.payload) if latest else None,
        lock_problem=owner.problem,
        damage=damage,
        wake_at_ms=meta.wake_at_ms,
        idle=idle_thread(meta),
    )


def idle_thread(meta: RunMeta) -> bool:
    """A paused thread kept by the code that uses it, idle (``PauseInfo.idle``)."""
    return meta.status is RunStatus.PAUSED and meta.pause is not None and meta.pause.idle


def newest_unreadable(reader: RunReader, latest: Checkpoint | None) -> str | None:
    """Why the run's newest checkpoint could not be read, when ``latest`` (what
    :meth:`RunReader.latest` returned) is older than a checkpoint the run holds.

    Costs nothing when ``latest()`` skipped nothing: a healthy run is not listed again.
    """
    damaged = reader.catalog.damaged_packs()
    if not reader.skipped and not damaged:
        return None
    have = latest.seq if latest is not None else 0
    newest = max((f.seq for f in reader.checkpoint_files()), default=0)
    for name, reason in damaged.items():
        pack = parse_pack_name(name)
        if pack is not None and pack.last > newest:
            newest = pack.last
            if pack.last > have and not reader.skipped:
                return f"{name}: {reason}"
    if newest <= have:
        return None  # e.g. a `latest` a crash left dangling: nothing acknowledged is lost
    first = reader.skipped[0] if reader.skipped else None
    why = f" ({first.name}: {first.reason})" if first is not None else ""
    return f"newest checkpoint {newest} cannot be read{why}"


def _damaged_info(run_id: str, meta: RunMeta, damage: str) -> RunInfo:
    """What can be listed of a run whose checkpoints could not be read: its meta."""
    from afk_local.storage.views.run_info import RunInfo, tags_of  # noqa: PLC0415

    return RunInfo(
        run_id=run_id,
        status=meta.status,
        step=0,
        phase=None,
        seq=0,
        updated_ms=meta.updated_ms,
        owner_alive=False,
        bytes=0,
        thread_id=meta.thread_id,
        parent_run_id=meta.parent_run_id,
        entrypoint=meta.entrypoint,
        attempt=meta.attempt,
        created_ms=meta.created_ms,
        tags=tags_of(meta.extra),
        damage=damage,
        wake_at_ms=meta.wake_at_ms,
        idle=idle_thread(meta),
    )


def list_runs(store: ListedStore, wanted: RunFilter, limit: int | None) -> RunList:
    """The readable runs ``wanted`` admits, newest created first, at most ``limit`` (see
    :meth:`afk_local.Store.runs`)."""
    from afk_local.storage.views.run_info import RunList  # noqa: PLC0415

    listed = iter_runs(store, wanted)
    return RunList(listed if limit is None else itertools.islice(listed, limit))


def page_runs(
    store: PagedStore, wanted: RunFilter, offset: int, limit: int
) -> tuple[RunList, int | None, bool]:
    """One page of the runs ``wanted`` admits, for a store too large to list whole.

    Runs are ordered newest first by the last change of their ``run.meta`` (its mtime:
    one ``lstat`` per run, nothing read), then read in that order only as far as the
    page needs: the meta of a run only when the filter looks at it (status, name,
    tags), its checkpoints only for the runs on the page and for a filter on recent
    activity. A filter on liveness looks only at the runs whose status, as the store's
    meta index holds it (checked by a ``stat`` a run), expects an owner, and decides each
    from its lock before anything of it is read (:class:`_OwnerTest`). Returns
    the page, how many runs the filter admits (None when that would need reading the
    rest of the store) and whether runs follow the page.
    """
    from afk_local.storage.views.run_info import RunList  # noqa: PLC0415

    page = RunList()
    if not wanted.needs_meta and not wanted.needs_info:  # every run is admitted
        order = _newest_meta_first(store)
        for run_id in order[offset : offset + limit]:
            listed = _page_entry(store, run_id, None)
            if listed is not None:
                page.append(listed)
        return page, len(order), len(order) > offset + limit
    owner = _owner_test(store, wanted)
    order = owner.order if owner is not None else _newest_meta_first(store)
    # Only a filter on recent activity needs a run's checkpoints to decide it; the
    # others read them for the runs shown, and count the rest when that reads no meta.
    by_info = wanted.since_ms is not None or (wanted.needs_info and owner is None)
    counting = not wanted.needs_meta and not by_info
    admitted, more = 0, False
    for run_id in order:
        meta = None
        if wanted.needs_meta:
            try:
                meta = store.read_meta(run_id)
            except AfkLocalError:
                continue  # a run being created, or a damaged meta: `verify` reports it
            if not wanted.admits_meta(meta):
                continue
        if owner is not None and not owner(run_id):
            continue
        if not by_info and not offset <= admitted < offset + limit:
            admitted += 1  # before or after the page: its checkpoints are not read
            if admitted > offset + limit:
                more = True
                if not counting:
                    return page, None, True
            continue
        info = _page_entry(store, run_id, meta)
        if info is None or not wanted.admits(info):
            continue
        admitted += 1
        if admitted <= offset:
            continue
        if len(page) == limit:
            return page, None, True
        page.append(info)
    return page, admitted, more


class _OwnerTest:
    """For a filter on liveness: the runs it may admit, and the test each must pass
    before it is read.

    Only a run whose status expects an owner (``created``, ``running``) can be live or
    interrupted (:meth:`RunFilter.admits`); the store's meta index knows each run's status,
    each summary checked against the run's ``run.meta`` by a ``stat`` when it is asked
    for. So the candidates are those runs, newest ``run.meta`` first (the mtime the
    summary was checked at), and a candidate's lock decides it: held (``live``) or free
    and sound (``interrupted``, :func:`is_interrupted`). A run that passes is then read
    from its own files and checked again, so what a listing shows is never older than
    the listing.
    """

    def __init__(self, store: ListedStore, status: str) -> None:
        self._store = store
        self._live = status == "live"
        summaries = store.meta_index().summaries()
        expecting = [(s.mtime_ns, run_id) for run_id, s in summaries.items() if s.expects_owner]
        expecting.sort(reverse=True)
        self.order = [run_id for _, run_id in expecting]
        self._expecting = set(self.order)

    def __call__(self, run_id: str) -> bool:
        """Whether ``run_id``'s lock says what the filter asks (False for a non-candidate)."""
        if run_id not in self._expecting:
            return False
        try:
            lock = self._store.paths(run_id, refuse_links=True).lock
        except AfkLocalError:
            return False  # a symlinked run is listed by no one: `verify` reports it
        probe = probe_owner(lock)
        return probe.held if self._live else is_interrupted(RunStatus.RUNNING, probe)


def _owner_test(store: ListedStore, wanted: RunFilter) -> _OwnerTest | None:
    """The :class:`_OwnerTest` of a filter on liveness; None for any other filter."""
    from afk_local.storage.views.run_filter import LIVENESS  # noqa: PLC0415

    status = wanted.status
    return _OwnerTest(store, status) if status is not None and status in LIVENESS else None


class PagedStore(ListedStore, Protocol):
    """What a paged listing needs of a store besides a listing's (:class:`afk_local.Store`)."""

    @property
    def runs_dir(self) -> Path:
        """The directory holding one directory per run."""
        ...


def _newest_meta_first(store: PagedStore) -> list[str]:
    """Run ids, the most recently changed ``run.meta`` first (a run without one is left out)."""
    runs_dir = os.fspath(store.runs_dir)
    stamped = []
    for run_id in store.run_ids():
        try:
            changed = os.lstat(os.path.join(runs_dir, run_id, META_NAME)).st_mtime_ns
        except OSError:
            continue  # a run being created: listed once its meta is there
        stamped.append((changed, run_id))
    stamped.sort(reverse=True)
    return [run_id for _, run_id in stamped]


def _page_entry(store: ListedStore, run_id: str, meta: RunMeta | None) -> RunInfo | None:
    """The :class:`RunInfo` of a run for a listing: a run whose checkpoints cannot be read
    is one marked line (from its meta), one whose meta cannot be read is left out (a run
    being created, or a damaged meta: ``verify`` reports it)."""
    try:
        return store.info(run_id)
    except Exception as exc:
        log.debug("run %s: cannot be listed", run_id, exc_info=True)
        if meta is None:
            try:
                meta = store.read_meta(run_id)
            except AfkLocalError:
                return None
        return _damaged_info(run_id, meta, run_failure(exc))


def iter_runs(store: ListedStore, wanted: RunFilter) -> Iterator[RunInfo]:
    """The readable runs ``wanted`` admits, newest created first (ties: the greater run
    id first), each read when it is its turn.

    The store's meta index (:mod:`.meta_index`) gives the order from one directory scan
    and the creation times it holds (a run's never changes), reading only runs it does
    not know: the first run comes before the others are even looked at. Each run listed
    is read from its own files then, so what it shows is never older than the listing.
    A filter on a status skips, with one ``stat``, each run whose ``run.meta`` is still
    the one the index summarised with another status; one on liveness each run whose
    lock says no (:func:`_owner_test`).
    """
    index = store.meta_index()
    status = wanted.meta_status
    owner = _owner_test(store, wanted)
    for run_id in index.newest_first():
        if status is not None:
            known = index.summary(run_id)
            if known is not None and known.status != status:
                continue
        if owner is not None and not owner(run_id):
            continue
        info = _listed(store, run_id, wanted)
        if info is not None:
            yield info


def _listed(store: ListedStore, run_id: str, wanted: RunFilter) -> RunInfo | None:
    """The RunInfo of ``run_id`` when ``wanted`` admits it, else None."""
    try:
        meta = store.read_meta(run_id)
        if not wanted.admits_meta(meta):
            return None
    except AfkLocalError:
        return None  # a run being created, or a damaged meta: `verify` reports it
    try:
        info = store.info(run_id)
    except RunNotFoundError:
        return None  # deleted since its meta was read: not a damaged run
    except Exception as exc:  # one damaged run is one marked line, never the listing
        if not os.path.lexists(store.paths(run_id).meta):
            return None  # deleted while it was read: another file gone under the reader
        log.debug("run %s: cannot be listed", run_id, exc_info=True)
        info = _damaged_info(run_id, meta, run_failure(exc))
    return info if wanted.admits(info) else None


def interrupted(store: ListedStore) -> list[str]:
    """Ids of runs whose status says running (or created) but whose lock is free.

    A run whose ``owner.lock`` is damaged is not listed: nobody can take it over until
    a person repairs it (:attr:`RunInfo.lock_problem`). Only the runs whose meta (as the
    store's meta index knows it, checked by a ``stat``) expects an owner are read.
    """
    found = []
    for run_id, summary in store.meta_index().summaries().items():
        if not summary.expects_owner:
            continue
        try:
            meta = store.read_meta(run_id)
        except AfkLocalError:
            continue
        # The status first: only a run that expects an owner is worth a lock probe.
        if meta.status.expects_owner and is_interrupted(
            meta.status, probe_owner(store.paths(run_id).lock)
        ):
            found.append(run_id)
    return sorted(found)


__all__ = [
    "ListedStore",
    "PagedStore",
    "interrupted",
    "iter_runs",
    "list_runs",
    "newest_unreadable",
    "page_runs",
    "run_info",
]
