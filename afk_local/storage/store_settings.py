"""A store's directory and settings, and the checks before anything is written to it.

The lowest part of a :class:`~afk_local.storage.store.Store`: its options and the
attributes they set, its key and head records, its mirror, the copied-store and
read-only checks (``prepare_write``, ``require_writable``) and the paths of its runs.
"""

from __future__ import annotations

import enum
import errno
import os
import stat
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from afk_local.errors import (
    AfkLocalError,
    StoreReadOnlyError,
    StoreUnusableError,
)
from afk_local.storage import fsio
from afk_local.storage.format.codec import DecHook, EncHook, RecordCodec
from afk_local.storage.format.integrity import signer_for
from afk_local.storage.format.layout import (
    REQUESTS_DIR,
    RUNS_DIR,
    RunPaths,
    validate_run_id,
)
from afk_local.storage.meta_index import MetaIndex
from afk_local.storage.rundir.mirror import Mirror, open_mirror
from afk_local.storage.rundir.options import StoreOptions, store_root
from afk_local.storage.rundir.read.heads import HeadStore
from afk_local.storage.rundir.write.creation import refuse_linked_dirs
from afk_local.storage.store_identity import HomeCheck, ensure_identity
from afk_local.storage.store_key import key_problem, known_keyed, prepare_write

if TYPE_CHECKING:
    pass


class _Unset(enum.Enum):
    """The type of a keyword argument left out, where None already means something."""

    UNSET = "unset"


_UNSET = _Unset.UNSET


class StoreSettings:
    """A store's root, settings and write checks (see :class:`~afk_local.storage.store.Store`)."""

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
