"""The root of many runs: create, open, list and delete run directories.

Example:
    >>> import afk_local as afk
    >>> store = afk.Store("/tmp/afk-doc-store")
    >>> with store.create() as run:
    ...     _ = run.checkpoint("runtime_state", {"done": 1}, step=1)
    >>> store.open(run.run_id).latest().payload
    {'done': 1}
"""

from __future__ import annotations

import contextlib
import enum
import errno
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from afk_local.errors import (
    AfkLocalError,
    RunLockedError,
    RunNotFoundError,
    StoreReadOnlyError,
    StoreUnusableError,
)
from afk_local.storage import fsio, listing, maintenance
from afk_local.storage.format.codec import DecHook, EncHook, RecordCodec
from afk_local.storage.format.integrity import signer_for
from afk_local.storage.format.layout import (
    REQUESTS_DIR,
    RUNS_DIR,
    RunPaths,
    validate_run_id,
)
from afk_local.storage.format.layout import new_run_id as fresh_run_id
from afk_local.storage.format.records import RunMeta, RunStatus
from afk_local.storage.meta_index import MetaIndex
from afk_local.storage.rundir.mirror import Mirror, open_mirror
from afk_local.storage.rundir.options import StoreOptions, store_root
from afk_local.storage.rundir.ownership import (
    lock_is_held,
)
from afk_local.storage.rundir.read.heads import HeadStore
from afk_local.storage.rundir.read.reader import RunReader, read_meta
from afk_local.storage.rundir.write.creation import new_run_meta, refuse_linked_dirs
from afk_local.storage.store_identity import HomeCheck, ensure_identity
from afk_local.storage.store_key import key_problem, known_keyed, prepare_write

# Writing, gc, packing, fork and the run listings are imported where they are
# used: a process that only opens a store and reads a run (a LangGraph saver's cold
# get_tuple, `afk-local show`) does not pay for them, nor for filelock and the journal.
if TYPE_CHECKING:
    from afk_local.storage.ops.retention import GcReport, RetentionPolicy
    from afk_local.storage.rundir.packing import PackReport
    from afk_local.storage.rundir.write.writer import RunWriter
    from afk_local.storage.views.run_info import RunInfo, RunList


class _Unset(enum.Enum):
    """The type of a keyword argument left out, where None already means something."""

    UNSET = "unset"


_UNSET = _Unset.UNSET


class Store:
    """A directory of runs (``<root>/runs/<run_id>/``).

    Every setting is in a :class:`~afk_local.StoreOptions` (docs/options.md lists each
    one, its default and its environment variable). Pass ``options=`` or the
    keyword arguments below, or both (a keyword given wins over ``options``).
    Without ``options`` the environment is read once, here
    (:meth:`StoreOptions.from_environ`); an explicit ``options`` is used as it is.

    Args:
        root: the store's directory; default ``$AFK_LOCAL_ROOT``, else ``./.afk``.
        options: every setting at once; default ``StoreOptions.from_environ()``.
        enc_hook / dec_hook: msgspec hooks for custom payload types (never pickle).
        max_record_bytes: largest decoded record written or read (default
            ``$AFK_LOCAL_MAX_RECORD_BYTES``, else 256 MiB). Reading a record allocates at
            most this much (plus one delta base of at most 64 MiB).
        lock_timeout: seconds a writer waits for a run's lock before RunLockedError.
        max_chain: deltas after which a new keyframe is written (at most 1024).
        key: a secret (bytes or text) that turns on tamper evidence: every file and
            journal record is signed with HMAC-SHA256, and unsigned or wrongly signed
            ones count as damaged (docs/format.md, "Tamper evidence"). Default:
            ``$AFK_LOCAL_KEY`` when set, else no key (files are not signed).
        mirror: a remote to mirror every run this store writes to, as a URL
            (``s3://bucket/prefix``, ``gs://``, ``az://``, ``file:///abs/path``; needs the
            ``remote`` extra) or a :class:`~afk_local.storage.rundir.mirror.Mirror`. Each
            acknowledged checkpoint and journal record is uploaded in the background,
            in order; a writer's flush and close wait for it and raise its errors, and
            a run whose lease another store took refuses writes (docs/remote.md).
            Default: ``$AFK_LOCAL_MIRROR`` when set, else none; ``""`` means none.
        head_dir: where a keyed store keeps its runs' head records (rollback
            protection, docs/security.md); it must be outside the store. Default
            ``$AFK_LOCAL_HEAD_DIR``, else the user's state directory.
        pack_loose_limit: loose checkpoint files a writer lets accumulate before it
            folds the older ones into a pack (docs/format.md, "Packs"); None or 0:
            never (``Store.pack`` and ``afk-local pack`` still pack on request).
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        *,
        options: StoreOptions | None = None,
        enc_hook: EncHook | None = None,
        dec_hook: DecHook | None = None,
        max_record_bytes: int | None = None,
        lock_timeout: float | None = None,
        max_chain: int | None = None,
        key: bytes | str | None = None,
        mirror: str | Mirror | None = None,
        head_dir: str | os.PathLike[str] | None = None,
        pack_loose_limit: int | _Unset | None = _UNSET,
    ) -> None:
        given: dict[str, Any] = {
            name: value
            for name, value in (
                ("enc_hook", enc_hook),
                ("dec_hook", dec_hook),
                ("max_record_bytes", max_record_bytes),
                ("lock_timeout", lock_timeout),
                ("max_chain", max_chain),
                ("key", key),
                ("mirror", mirror),
                ("head_dir", head_dir),
            )
            if value is not None
        }
        if not isinstance(pack_loose_limit, _Unset):
            given["pack_loose_limit"] = pack_loose_limit
        base = options if options is not None else StoreOptions.from_environ()
        self.options: StoreOptions = replace(base, **given) if given else base
        """Every setting of this store (:class:`~afk_local.StoreOptions`)."""
        options = self.options
        self.root = store_root(root)
        self.env: fsio.Env = options.env
        """The I/O seam this store and its writers write through."""
        signer = signer_for(options.key)
        self.codec = RecordCodec(
            enc_hook=options.enc_hook, dec_hook=options.dec_hook, signer=signer
        )
        self._mirror: Mirror | None = None
        self.mirror_url: str | None = None
        """The URL of the remote this store mirrors its runs to, if any."""
        if isinstance(options.mirror, str):
            self.mirror_url = options.mirror or None
        elif options.mirror is not None:
            self.mirror_url, self._mirror = options.mirror.url, options.mirror
        self.head_dir = options.resolved_head_dir()
        """Where this store's head records live (used when the store is keyed)."""
        self._head_dir_given = options.head_dir is not None
        self.heads: HeadStore | None = (
            None if signer is None else HeadStore(self.root, self.head_dir, signer)
        )
        """The store's head records (None without a key: rollback protection needs one)."""
        self._meta_index: MetaIndex | None = None
        self._home = HomeCheck()

    @property
    def max_record_bytes(self) -> int:
        """The largest decoded record this store writes or reads (``options.max_record_bytes``)."""
        return self.options.max_record_bytes

    @max_record_bytes.setter
    def max_record_bytes(self, value: int) -> None:
        self.options = replace(self.options, max_record_bytes=value)

    @property
    def lock_timeout(self) -> float:
        """Seconds a writer waits for a run's lock (``options.lock_timeout``)."""
        return self.options.lock_timeout

    @lock_timeout.setter
    def lock_timeout(self, value: float) -> None:
        self.options = replace(self.options, lock_timeout=value)

    @property
    def max_chain(self) -> int:
        """Deltas after which a writer starts a new keyframe (``options.max_chain``)."""
        return self.options.max_chain

    @max_chain.setter
    def max_chain(self, value: int) -> None:
        self.options = replace(self.options, max_chain=value)

    @property
    def pack_loose_limit(self) -> int | None:
        """Loose files a writer keeps before packing (``options.pack_loose_limit``)."""
        return self.options.pack_loose_limit

    @pack_loose_limit.setter
    def pack_loose_limit(self, value: int | None) -> None:
        self.options = replace(self.options, pack_loose_limit=value)

    def __repr__(self) -> str:
        keyed = ", keyed" if self.keyed else ""
        mirrored = f", mirror={self.mirror_url!r}" if self.mirror_url else ""
        return f"Store(root={str(self.root)!r}{keyed}{mirrored})"

    @property
    def mirror(self) -> Mirror | None:
        """The store's remote mirror, opened on first use (None without one).

        Raises:
            MirrorError: the URL's scheme has no implementation here (the extra is missing).
        """
        if self._mirror is None and self.mirror_url is not None:
            self._mirror = open_mirror(self.mirror_url, self.root)
        return self._mirror

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

    @property
    def keyed(self) -> bool:
        """True when this store signs and checks its files (a key, or ``$AFK_LOCAL_KEY``)."""
        return self.codec.signer is not None

    @property
    def known_keyed(self) -> bool:
        """True when the store says it is keyed: its marker, or head records kept for it.

        A process without the key refuses to write into such a store or to execute
        anything from it (read-only commands read it, with a warning).
        """
        return known_keyed(self.root, self.head_dir)

    @property
    def head_dir_given(self) -> bool:
        """True when ``head_dir`` was passed explicitly (the watcher hands it to children)."""
        return self._head_dir_given

    def key_problem(self) -> str | None:
        """Why this process may not write into (or execute from) this store; None when it may.

        A store that is keyed but opened without the key, or with another key.
        """
        return key_problem(self.root, self.head_dir, self.codec.signer)

    def prepare_write(self, run_id: str = "") -> None:
        """Check that this process may write into the store, mark it keyed if it is, and
        give it an identity if it has none (:mod:`afk_local.storage.store_identity`).

        Raises:
            KeyRequiredError: a keyed store opened without the key.
            UntrustedStoreError: a keyed store opened with another key.
            StoreUnusableError: the store's directory cannot be made or written.
        """
        self.require_writable()
        try:
            prepare_write(self.root, self.head_dir, self.codec.signer, run_id, self.env)
            ensure_identity(self.root, self.codec.signer, self.env)
        except AfkLocalError:
            raise  # says what is wrong already (a full disk, a key problem)
        except OSError as exc:  # the root cannot be made or written: one line, not a traceback
            raise StoreUnusableError(
                str(self.root),
                exc.errno or errno.EIO,
                exc.strerror or str(exc),
                str(exc.filename or self.root),
            ) from None

    def require_writable(self) -> None:
        """Refuse, in one line, a store this process cannot write (a ``statvfs`` and an
        ``access`` call).

        Raises:
            StoreReadOnlyError: the store's root (or its ``runs/``) is on a read-only
                filesystem or not writable by this process.
        """
        for path in (self.root, self.runs_dir):
            try:  # a read-only mount; access() alone misses a read-only bind mount for root
                read_only = bool(os.statvfs(path).f_flag & os.ST_RDONLY)
            except OSError:
                continue  # not there yet: whoever makes it says why it cannot
            if read_only or not os.access(path, os.W_OK):
                code = errno.EROFS if read_only else errno.EACCES
                where = os.path.abspath(self.root)
                raise StoreReadOnlyError(where, code, os.strerror(code), os.path.abspath(path))

    def moved_from(self) -> str | None:
        """The path this store was created at when it was since copied or moved; else None.

        A moved store runs nothing (the trust gate refuses) until ``afk-local adopt``.
        """
        return self._home.moved_from(self.root, self.codec.signer)

    @property
    def runs_dir(self) -> Path:
        """``<root>/runs``."""
        return self.root / RUNS_DIR

    @property
    def requests_dir(self) -> Path:
        """``<root>/requests``: resume requests for the watcher."""
        return self.root / REQUESTS_DIR

    def paths(self, run_id: str, *, refuse_links: bool = False) -> RunPaths:
        """The paths of run ``run_id`` (validated; nothing is created).

        With ``refuse_links`` (what every operation that reads or writes the run uses),
        ``runs/`` and ``runs/<run_id>`` are checked first: nothing is read otherwise.

        Raises:
            UntrustedStoreError: with ``refuse_links``, ``runs/<run_id>`` (or ``runs/``)
                is a symlink or not a directory: it is never followed out of the store.
        """
        paths = RunPaths(validate_run_id(run_id), self.runs_dir / run_id)
        if refuse_links:
            refuse_linked_dirs(self.runs_dir, paths)
        return paths

    def exists(self, run_id: str) -> bool:
        """True when the run has a ``run.meta`` (a symlinked run directory does not count)."""
        paths = self.paths(run_id)
        try:
            return stat.S_ISDIR(os.lstat(paths.dir).st_mode) and stat.S_ISREG(
                os.lstat(paths.meta).st_mode
            )
        except OSError:
            return False

    # -- writing ------------------------------------------------------------------

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
    ) -> RunWriter:
        """Create a new run and return its writer, holding the run's lock.

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
        return self._open_writer(paths, 0.0, new_meta=meta, defer_publish=publish_with_first_write)

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

    def delete(
        self,
        run_id: str,
        *,
        keep_effects: bool = False,
        check: Callable[[RunMeta], None] | None = None,
    ) -> Path | None:
        """Delete a run whole. Refuses (RunLockedError) while its owner is alive.

        With ``keep_effects``, the run's effect journal (and meta) is first kept under
        ``<root>/removed/`` (:mod:`.removal`); returns that directory (None otherwise).
        ``check`` is called with the run's meta under the run's lock, before anything
        changes: it raises to keep the run (a status that changed since it was listed).
        """
        return maintenance.delete(
            self, run_id, only_final=False, keep_effects=keep_effects, check=check
        )[1]

    # -- reading ------------------------------------------------------------------

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
            status: a status, or ``"interrupted"`` / ``"live"``.
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

    def gc(self, policy: RetentionPolicy | None = None, *, dry_run: bool = False) -> GcReport:
        """Compact runs and delete old final runs per ``policy`` (:mod:`.retention`).

        Runs whose owner is alive are never touched; only final runs (completed,
        cancelled) lose effects or are deleted, decided under each run's lock; kill -9
        at any instant leaves every run resumable.
        """
        return maintenance.gc(self, policy, dry_run=dry_run)

    def pack(
        self,
        run_ids: list[str] | None = None,
        *,
        full: bool = True,
        merge: bool = True,
        keep_loose: int = 1,
        dry_run: bool = False,
    ) -> list[PackReport]:
        """Fold the loose checkpoint files of runs into pack files (docs/format.md, "Packs").

        Every checkpoint stays readable by seq, through every reader, and a crash at
        any instant loses nothing. A run whose owner is alive is skipped (its writer
        packs as it goes); a run that cannot be packed (in a keyed store: one behind
        its head record, rolled back) is reported, never raised.

        Args:
            run_ids: the runs (default: every run of the store).
            full: merge each run's packs into as few as the size bounds allow.
            merge: False: add a pack per run and leave its existing packs alone (a run
                written before manifests existed is merged once, to adopt it).
            keep_loose: the newest loose files of each run that stay loose (>= 1).
            dry_run: say what would happen, change nothing.
        """
        return maintenance.pack(
            self, run_ids, full=full, merge=merge, keep_loose=keep_loose, dry_run=dry_run
        )

    def fork(
        self,
        run_id: str,
        at_seq: int | None,
        new_run_id: str | None = None,
        *,
        updates: dict[str, Any] | None = None,
        salvage: bool = False,
    ) -> RunInfo:
        """A new run whose history is ``run_id``'s up to checkpoint ``at_seq`` (:mod:`.fork`).

        ``updates`` (``{"state.total": 5}``) edits the state the fork continues from.
        ``salvage=True`` forks a run whose effect journal is damaged: the fork keeps the
        journal's intact prefix (calls recorded after the damage become in doubt) and,
        with ``at_seq=None``, continues from the newest checkpoint taken before the
        damage (docs/cli.md, ``fork --salvage``).
        """
        return maintenance.fork(self, run_id, at_seq, new_run_id, updates=updates, salvage=salvage)

    def ensure_unlocked(self, run_id: str) -> None:
        """Raise RunLockedError when the run's owner is alive."""

        paths = self.paths(run_id)
        if lock_is_held(paths.lock):
            raise RunLockedError(run_id, str(paths.lock))


StoreLike = Store | str | os.PathLike[str] | None
"""What a ``store=`` argument takes: a :class:`Store`, its root directory, or None (the default)."""


def as_store(store: StoreLike) -> Store:
    """``store`` itself, or a :class:`Store` on the root directory it names."""
    return store if isinstance(store, Store) else Store(store)


def _reader_html(reader: RunReader) -> str:
    """A reader's notebook view, imported on first display (a cold open never needs it)."""
    from afk_local.storage.views.notebook import run_reader_html  # noqa: PLC0415

    return run_reader_html(reader)
