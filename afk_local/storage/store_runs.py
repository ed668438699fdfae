"""The runs of a store: creating one, opening it to read or to write, and listing them."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from afk_local.errors import (
    AfkLocalError,
    RunNotFoundError,
)
from afk_local.storage import listing
from afk_local.storage.format.layout import (
    RunPaths,
    validate_run_id,
)
from afk_local.storage.format.layout import new_run_id as fresh_run_id
from afk_local.storage.format.records import RunMeta, RunStatus
from afk_local.storage.meta_index import MetaIndex
from afk_local.storage.rundir.ownership import (
    lock_is_held,
)
from afk_local.storage.rundir.read.reader import RunReader, read_meta
from afk_local.storage.rundir.write.creation import new_run_meta

if TYPE_CHECKING:
    from afk_local.storage.rundir.write.writer import RunWriter
    from afk_local.storage.views.run_info import RunInfo, RunList
from afk_local.storage.store_settings import StoreSettings


def _reader_html(reader: RunReader) -> str:
    """A reader's notebook view, imported on first display (a cold open never needs it)."""
    from afk_local.storage.views.notebook import run_reader_html  # noqa: PLC0415

    return run_reader_html(reader)


class StoreRuns(StoreSettings):
    """Create, open and list the runs of a store (see :class:`~afk_local.storage.store.Store`)."""

    def _repr_html_(self) -> str:
        """Notebook view: every run as a table (status colours, progress bars)."""
        import html  # noqa: PLC0415 - only notebooks render HTML; html.entities is large

        runs = self.runs()
        return runs._repr_html_().replace(
            '<table class="afk-local afk-local-runs">',
            '<table class="afk-local afk-local-runs">'
            f"<caption>{html.escape(str(self.root))}: {len(runs)} run(s)</caption>",
            1,
        )

    def create(
        self,
        run_id: str | None = None,
        *,
        thread_id: str | None = None,
        entrypoint: str | None = None,
        params: Any = None,
        parent_run_id: str | None = None,
        code_fingerprint: str | None = None,
        version: str | None = None,
        extra: dict[str, Any] | None = None,
        publish_with_first_write: bool = False,
        new_attempt: bool = True,
    ) -> RunWriter:
        """Create a new run and return its writer, holding the run's lock.

        The run's first attempt is this writer's (``attempt`` 1, this process as owner),
        unless ``new_attempt`` is False: a run made for another process to start (a
        schedule's slot, a submitted or restarted run) records attempt 0 and no owner,
        so its first start is attempt 1 and it is listed as not started until then.

        The run is built under a temporary name and appears whole, with one rename.
        With ``publish_with_first_write`` (what durable functions use) it appears with
        the writer's first checkpoint (or first use of its journal, or close), which
        then makes the run, its meta changes and that checkpoint durable together; until
        then it is not in the store, and a ``RunExistsError`` of a creator that lost a
        race for the same run id comes from that write (docs/guarantees.md, "What a new
        run costs"). Stores with a key or a mirror publish at once.
        """
        paths = self.paths(run_id if run_id is not None else fresh_run_id())
        meta = new_run_meta(
            paths.run_id,
            thread_id=thread_id,
            entrypoint=entrypoint,
            params=params,
            parent_run_id=parent_run_id,
            code_fingerprint=code_fingerprint,
            version=version,
            extra=extra,
        )
        self.prepare_write(paths.run_id)
        return self._open_writer(
            paths,
            0.0,
            new_meta=meta,
            new_attempt=new_attempt,
            defer_publish=publish_with_first_write,
        )

    def resume_writer(
        self, run_id: str, *, lock_timeout: float | None = None, new_attempt: bool = True
    ) -> RunWriter:
        """Take the lock of an existing run and return its writer.

        ``new_attempt=False`` for writes that are not an attempt to run it (cancel,
        settle): the run's ``attempt`` count stays as it is. An attempt is refused in a
        store that was copied or moved and not adopted since: its effects already ran
        where the store came from, and the copy would run them again.

        Raises:
            RunNotFoundError: no such run.
            RunLockedError: another writer holds it (after ``lock_timeout``).
            StoreMovedError: an attempt in a copied or moved store (``afk-local adopt``).
        """

        paths = self.paths(run_id, refuse_links=True)
        if not self.exists(run_id):
            raise RunNotFoundError(run_id, str(self.root))
        if new_attempt:
            self._home.require(self.root, self.codec.signer, run_id)
        self.prepare_write(run_id)
        timeout = self.lock_timeout if lock_timeout is None else lock_timeout
        return self._open_writer(paths, timeout, new_attempt=new_attempt)

    def _open_writer(
        self,
        paths: RunPaths,
        lock_timeout: float,
        *,
        new_meta: RunMeta | None = None,
        new_attempt: bool = True,
        defer_publish: bool = False,
    ) -> RunWriter:
        from afk_local.storage.rundir.write.writer import open_writer  # noqa: PLC0415

        return open_writer(
            paths,
            self.options,
            record_codec=self.codec,
            lock_timeout=lock_timeout,
            new_meta=new_meta,
            new_attempt=new_attempt,
            mirror=self.mirror,
            heads=self.heads,
            defer_publish=defer_publish,
        )

    def open(self, run_id: str, *, lazy: bool = False) -> RunReader:
        """A read-only view of a run (no lock).

        With ``lazy``, nothing is read yet: the view of a run that may be damaged (to
        verify it, or show what is left of it).

        Raises:
            RunNotFoundError: no such run (not raised when ``lazy``).
            UntrustedStoreError: the run directory is a symlink (never followed).
        """
        reader = RunReader(
            self.paths(run_id, refuse_links=True),
            record_codec=self.codec,
            max_record_bytes=self.max_record_bytes,
            heads=self.heads,
            html_view=_reader_html,
            env=self.env,
        )
        if not lazy:
            reader.meta  # noqa: B018 - raises RunNotFoundError now rather than later
        return reader

    def run_ids(self) -> list[str]:
        """Ids of every run directory, sorted (unvalidated names are ignored)."""
        try:
            with os.scandir(self.runs_dir) as entries:
                names = [e.name for e in entries if e.is_dir(follow_symlinks=False)]
        except FileNotFoundError:
            return []
        valid = []
        for name in names:
            with contextlib.suppress(AfkLocalError):
                valid.append(validate_run_id(name))
        return sorted(valid)

    def meta_index(self) -> MetaIndex:
        """The index of this store's runs' metas (:mod:`.meta_index`), one per Store
        object: listings and sweeps bring it up to date with a ``stat`` per run."""
        if self._meta_index is None:
            self._meta_index = MetaIndex(self.root, self.runs_dir, self.codec)
        return self._meta_index

    def read_meta(self, run_id: str) -> RunMeta:
        """The ``run.meta`` of a run (cheap: one small file)."""
        return read_meta(self.paths(run_id, refuse_links=True), self.codec)

    def owner_alive(self, run_id: str) -> bool:
        """True when a process holds the run's ``owner.lock``."""

        return lock_is_held(self.paths(run_id).lock)

    def info(self, run_id: str) -> RunInfo:
        """The :class:`RunInfo` of one run."""
        return listing.run_info(self, run_id)

    def runs(
        self,
        status: RunStatus | str | None = None,
        *,
        since_ms: int | None = None,
        name: str | None = None,
        tags: dict[str, str | None] | None = None,
        limit: int | None = None,
    ) -> RunList:
        """The readable runs, newest created first (ties: the greater run id first),
        filtered (:class:`~.run_filter.RunFilter`).

        A run keeps its place as it changes; each is read from its own files when listed.

        Args:
            status: a status, or ``"interrupted"`` / ``"live"`` (a ``created`` or
                ``running`` run whose lock nobody / a process holds: only such runs are
                read).
            since_ms: only runs updated at or after this wall-clock millisecond stamp.
            name: a glob matched against the run id and the job's name.
            tags: ``{key: value}`` each run must be tagged with (value None: any value).
            limit: at most this many (the newest created).

        A notebook shows the result as a table; ``.to_pandas()`` makes a DataFrame.
        """
        from afk_local.storage.views.run_filter import RunFilter  # noqa: PLC0415

        wanted = RunFilter(status=status, since_ms=since_ms, name=name, tags=tags or {})
        return listing.list_runs(self, wanted, limit)

    def iter_runs(
        self,
        status: RunStatus | str | None = None,
        *,
        since_ms: int | None = None,
        name: str | None = None,
        tags: dict[str, str | None] | None = None,
    ) -> Iterator[RunInfo]:
        """The runs :meth:`runs` lists, newest created first, one at a time: the first
        comes before the others are read (the store's index holds the order; for a
        store of many runs).

        Example:
            >>> import itertools
            >>> newest = list(itertools.islice(store.iter_runs("completed"), 10))  # doctest: +SKIP
        """
        from afk_local.storage.views.run_filter import RunFilter  # noqa: PLC0415

        wanted = RunFilter(status=status, since_ms=since_ms, name=name, tags=tags or {})
        return listing.iter_runs(self, wanted)

    def interrupted(self) -> list[str]:
        """Ids of runs whose status says running (or created) but whose lock is free.

        A run whose ``owner.lock`` is damaged is not listed: nobody can take it over
        until a person repairs it (:attr:`RunInfo.lock_problem`).
        """

        return listing.interrupted(self)
