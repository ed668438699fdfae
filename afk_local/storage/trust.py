"""The trust gate: a store is data, never instructions (docs/security.md).

Every path that executes code a store names — ``afk.resume`` / ``afk-local resume``
of a durable job (:mod:`afk_local.runner.operations.resume`), the rebuild of an agent
(:mod:`afk_local.agent.rebuild`), the watcher before it starts a child, and the
watcher's submit requests — first calls :func:`require_trusted_run` and acts only
on the :class:`TrustedRun` it returns. It refuses (:class:`~afk_local.UntrustedStoreError`)
when

- the store's root, ``runs/`` or the run's directory is a symlink, is not owned by
  the current user, or is writable by its group or by others; ``run.meta`` is not a
  regular file owned by the current user;
- the store is keyed but this process has no key, or another key
  (:mod:`afk_local.storage.store_key`); in a keyed store ``run.meta`` must carry a
  valid MAC (checked by :func:`~afk_local.storage.rundir.read.reader.read_meta`);
- for a run to be continued from its recorded origin (``from_origin``): the store was
  copied or moved (its identity records another path,
  :mod:`afk_local.storage.store_identity`): :class:`~afk_local.StoreMovedError` until
  ``afk-local adopt``;
- the run was imported and nobody has trusted it yet (``afk-local resume RUN --trust``);
- a keyed run is behind its head record: rolled back (:class:`~afk_local.RunRolledBackError`).

What the gate returns is only a run that may be acted on; which object a run's
entrypoint may resolve to (an ``@afk.durable`` function, an ``Agent`` or an
``@afk.agent_factory``) is checked by :func:`afk_local.runner.code.entrypoints.import_entrypoint`.
Read-only commands do not go through the gate: they read, and print
:func:`trust_warnings`.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from afk_local.errors import RunNotFoundError, UntrustedStoreError
from afk_local.storage import fsio
from afk_local.storage.format import codec
from afk_local.storage.format.layout import RunPaths
from afk_local.storage.format.records import IMPORTED_KEY, RunMeta, imported_mark, later_ms
from afk_local.storage.rundir.ownership import acquire_lock
from afk_local.storage.rundir.read.reader import read_meta
from afk_local.storage.rundir.run_changes import tell_meta
from afk_local.storage.store import Store
from afk_local.storage.store_identity import require_home
from afk_local.storage.store_key import marker_path

_FIX_MODE = "make it yours and private (chown $USER; chmod go-w)"


@dataclass(frozen=True)
class TrustedRun:
    """A run that passed :func:`require_trusted_run`, with the ``run.meta`` it was checked with."""

    store: Store
    run_id: str
    meta: RunMeta

    @property
    def paths(self) -> RunPaths:
        """The run's paths."""
        return self.store.paths(self.run_id)


def path_problem(path: str | os.PathLike[str], *, directory: bool) -> str | None:
    """Why ``path`` may not be trusted (None when it may): a symlink, another kind of file
    than expected, another owner, or group/world-writable."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None if directory else "missing"  # the command itself says what is in the way
    except OSError as exc:
        return f"cannot stat: {exc.strerror}"
    if stat.S_ISLNK(st.st_mode):
        return "is a symlink (never followed out of the store)"
    wanted = stat.S_ISDIR if directory else stat.S_ISREG
    if not wanted(st.st_mode):
        return f"is a {fsio.file_kind(st.st_mode)}, not a {'directory' if directory else 'file'}"
    uid = os.geteuid() if hasattr(os, "geteuid") else None
    if uid is not None and st.st_uid != uid:
        return f"is owned by uid {st.st_uid}, not by you (uid {uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by its group or by others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def store_problems(store: Store) -> list[tuple[str, str]]:
    """``(path, reason)`` for what makes the whole store untrusted (empty: nothing)."""
    found = []
    for path in (store.root, store.runs_dir):
        problem = path_problem(path, directory=True)
        if problem is not None:
            found.append((str(path), problem))
    key = store.key_problem()
    if key is not None:
        found.append((str(marker_path(store.root)), key))
    return found


def run_problems(store: Store, run_id: str) -> list[tuple[str, str]]:
    """``(path, reason)`` for what makes run ``run_id``'s files untrusted."""
    paths = store.paths(run_id)
    found = []
    problem = path_problem(paths.dir, directory=True)
    if problem is not None:
        found.append((str(paths.dir), problem))
    elif (problem := path_problem(paths.meta, directory=False)) not in (None, "missing"):
        found.append((str(paths.meta), problem))
    return found


def imported_from(meta: RunMeta) -> str | None:
    """Where an imported, not yet trusted run came from (None: not such a run)."""
    mark = meta.extra.get(IMPORTED_KEY) if isinstance(meta.extra, dict) else None
    if mark is None:
        return None
    source = mark.get("source") if isinstance(mark, dict) else None
    return source if isinstance(source, str) else "an export"


def require_trusted_run(store: Store, run_id: str, *, from_origin: bool = False) -> TrustedRun:
    """THE TRUST GATE: check run ``run_id`` before anything it names is executed.

    Returns the run with the ``run.meta`` the checks read; act on that meta, not on a
    later read.

    ``from_origin``: the run's job is to be found where it ran (re-imported from its
    recorded ``sys.path``, its script re-entered in its recorded working directory:
    ``afk.resume``, ``afk-local resume``/``restart``, the watcher). Then a store that was
    copied or moved is refused too, as its runs' origins name the old place, where
    their effects would run again. (``job.run(run_id=...)`` continues a run with the
    code and working directory of the calling process, so it does not ask this.)

    Raises:
        UntrustedStoreError: a check failed (the message names the path, what is wrong
            and what to do).
        RunRolledBackError: a keyed run is behind its head record.
        StoreMovedError: ``from_origin`` and the store was copied or moved and not
            adopted since.
        RunNotFoundError: no such run.
        CheckpointCorruptionError: ``run.meta`` is damaged, or in a keyed store unsigned
            or signed with another key.
    """
    for path, reason in [*store_problems(store), *run_problems(store, run_id)]:
        raise UntrustedStoreError(path, reason, _hint(path, reason), run_id)
    if from_origin:  # a copied or moved store's runs record the old directory and script
        require_home(store.root, store.codec.signer, run_id)
    paths = store.paths(run_id)
    if not os.path.lexists(paths.meta):
        raise RunNotFoundError(run_id, str(store.root))
    meta = read_meta(paths, store.codec)
    source = imported_from(meta)
    if source is not None:
        raise UntrustedStoreError(
            str(paths.meta),
            f"the run was imported from {source} and nobody has trusted it yet",
            f"read it first (`afk-local show {run_id}`, `afk-local inspect {run_id}`), then "
            f"run it with `afk-local resume {run_id} --trust`",
            run_id,
        )
    if store.heads is not None:

        def read_after_head() -> int | None:
            # the meta compared is read after the head (HeadStore.behind), and returned:
            # the caller acts on the meta the check compared
            nonlocal meta
            meta = read_meta(paths, store.codec)
            return meta.updated_ms

        store.heads.require_not_behind(paths, read_after_head)
    return TrustedRun(store, run_id, meta)


def _hint(path: str, reason: str) -> str:
    if "key" in reason:
        return "nothing in this store is executed without its key"
    if "symlink" in reason:
        return "replace the link by the directory itself"
    return f"nothing is executed from it until you {_FIX_MODE}"


def trust_run(store: Store, run_id: str) -> RunMeta:
    """Vouch for run ``run_id`` as it is on disk now: ``afk-local resume RUN --trust``.

    Clears the mark of an imported run and, in a keyed store, takes the run as it is
    as its new head (a copy put back on purpose is no longer reported as rolled back).
    The store's and the run's directory checks still apply: trusting does not make a
    directory others can write into safe.

    Raises:
        UntrustedStoreError: the store or the run's directory fails its checks.
        RunLockedError: the run's owner is alive.
    """
    for path, reason in [*store_problems(store), *run_problems(store, run_id)]:
        raise UntrustedStoreError(path, reason, _hint(path, reason), run_id)
    paths = store.paths(run_id)
    if not os.path.lexists(paths.meta):
        raise RunNotFoundError(run_id, str(store.root))
    lock = acquire_lock(paths, 0.0)
    try:
        meta = read_meta(paths, store.codec)
        extra: dict[str, Any] = dict(meta.extra) if isinstance(meta.extra, dict) else {}
        if extra.pop(IMPORTED_KEY, None) is not None or store.heads is not None:
            meta = msgspec.structs.replace(meta, extra=extra, updated_ms=later_ms(meta.updated_ms))
            store.env.atomic_write(paths.meta, codec.encode_meta(store.codec, meta))
            tell_meta(paths, meta, store.codec.signer, store.env)
        if store.heads is not None:
            store.heads.anchor(paths, meta.updated_ms)
        return meta
    finally:
        lock.release()


def trust_warnings(store: Store, run_id: str | None = None) -> list[str]:
    """One line per reason nothing would be executed from this store (or run): for
    read-only commands, which still read."""
    found = store_problems(store)
    if run_id is not None:
        found += run_problems(store, run_id)
    lines = [f"{path}: {reason}" for path, reason in found]
    try:
        moved_from = store.moved_from()
    except UntrustedStoreError as exc:  # a damaged or foreign-key identity: resume refuses
        return [*lines, f"{exc.path}: {exc.reason}"]
    if moved_from is not None:  # resume refuses (StoreMovedError); a listing says so first
        lines.append(
            f"{store.root}: this store was created at {moved_from} and is now here (copied "
            f"or moved); no run resumes from it until `afk-local --root {store.root} adopt`"
        )
    return lines


def request_file_problem(store: Store, path: Path, fd: int) -> str | None:
    """Why the request file open at ``fd`` may not be acted on (None: it may)."""
    problem = path_problem(store.requests_dir, directory=True)
    if problem is not None:
        return f"{store.requests_dir} {problem}"
    st = os.fstat(fd)
    uid = os.geteuid() if hasattr(os, "geteuid") else None
    if uid is not None and st.st_uid != uid:
        return f"{path.name} is owned by uid {st.st_uid}, not by you (uid {uid})"
    return None


__all__ = [
    "IMPORTED_KEY",
    "TrustedRun",
    "imported_from",
    "imported_mark",
    "path_problem",
    "request_file_problem",
    "require_trusted_run",
    "run_problems",
    "store_problems",
    "trust_run",
    "trust_warnings",
]
