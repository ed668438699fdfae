"""Creating a run directory: refusing links out of the store, the ``run.meta`` of a run
that has never run, and the new directory built under a temporary name and published
with one rename (:class:`NewRunDir`).

A new run is built in ``runs/.tmp-<run_id>...``: its ``owner.lock`` taken there, its
``run.meta`` (and, for a durable function, its first checkpoint and an empty
``effects.log``) written and fsynced, the directory fsynced, then renamed to
``runs/<run_id>`` and ``runs/`` fsynced (docs/guarantees.md, "What a new run costs").
A crash at any instant leaves either no run or a whole one, never a run id that
neither ``create`` nor ``resume_writer`` opens, and no other process can take the
lock of a run before its creator holds it. :func:`~.writer.open_writer` decides when
the directory is published; this module owns how.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from afk_local.errors import RunExistsError, UntrustedStoreError
from afk_local.storage import fsio
from afk_local.storage.format.layout import LOCK_NAME, RunPaths, validate_run_id
from afk_local.storage.format.records import RunMeta, now_ms
from afk_local.storage.rundir.ownership import acquire_lock, lock_is_held

# filelock is loaded where a lock is taken (ownership.acquire_lock), not on import.
if TYPE_CHECKING:
    from filelock import FileLock


def refuse_linked_dirs(runs_dir: Path, paths: RunPaths) -> None:
    """Refuse ``runs/`` or ``runs/<run_id>`` when either is a symlink or not a directory.

    Missing is fine (nothing to follow). Every operation that reads or writes a run
    checks this first: a store never follows a link out of itself.

    Raises:
        UntrustedStoreError: naming the path, what it is, and what to do.
    """
    for path in (runs_dir, paths.dir):
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(mode):
            raise UntrustedStoreError(
                str(path),
                f"is a {fsio.file_kind(mode)}, not a directory",
                "afk-local never follows a link out of the store; remove it",
                paths.run_id,
            )


class NewRunDir:
    """A new run's directory, built under a temporary name and not yet published.

    Made by :func:`begin_run_dir`, which already holds the run's lock in it. Nothing
    in it is durable or visible until :meth:`publish`; :meth:`abandon` removes it.
    """

    def __init__(self, paths: RunPaths, building: RunPaths, lock: FileLock, env: fsio.Env) -> None:
        self.paths = paths
        """Where the run is published."""
        self.building = building
        """The temporary directory it is built in."""
        self.lock = lock
        """The run's ``owner.lock``, held: it moves with the directory."""
        self._env = env

    def publish(
        self, meta: bytes, *, checkpoint: tuple[str, bytes] | None = None, journal: bool = False
    ) -> None:
        """Write ``run.meta`` (and ``checkpoint``, a ``(name, bytes)`` pointed at by
        ``latest``, and with ``journal`` an empty ``effects.log``), then publish the run
        durably: one fsync per file written, one of the new directory, one of ``runs/``.

        Raises:
            RunExistsError: another creator published the same run id first.
        """
        self._write_meta(meta)
        if checkpoint is not None:
            self._write_first_checkpoint(*checkpoint)
        if journal:  # empty: its name is made durable with the directory's, no fsync of its own
            os.close(self._env.open_append(self.building.journal))
        self._seal()
        self._appear()

    # One method per fsync: the crash explorer's site mutants remove them one at a time.

    def _write_meta(self, meta: bytes) -> None:
        self._env.write_new_file(self.building.meta, meta)

    def _write_first_checkpoint(self, name: str, data: bytes) -> None:
        self._env.write_new_file(self.building.dir / name, data)
        self._env.atomic_symlink(name, self.building.latest, sync_dir=False)

    def _seal(self) -> None:
        """Make the names in the new directory durable before it can appear."""
        self._env.fsync_dir(self.building.dir)

    def _appear(self) -> None:
        """Rename the directory into place (never over a run) and make that durable."""
        target = self.paths.dir
        if os.path.lexists(target):
            raise RunExistsError(self.paths.run_id, str(target))
        try:
            self._env.rename(self.building.dir, target)
        except OSError as exc:
            # Linux replaces an *empty* directory silently; a non-empty one fails like this.
            if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                raise RunExistsError(self.paths.run_id, str(target)) from None
            raise
        self._env.fsync_dir(target.parent)

    def abandon(self) -> None:
        """Remove the unpublished directory (the lock is its caller's to release)."""
        with contextlib.suppress(OSError):
            self._env.remove_temp_entry(self.building.dir)


def begin_run_dir(paths: RunPaths, runs_dir: Path, env: fsio.Env = fsio.DEFAULT_ENV) -> NewRunDir:
    """Start building run ``paths`` under a temporary name in ``runs_dir``, its lock held.

    A run directory without a ``run.meta`` and without a live owner, holding nothing
    but ``owner.lock`` and temporaries, is what an older afk_local left when a crash
    cut its ``create`` short: it is cleared away so that the run id can be used.

    Raises:
        RunExistsError: the run exists already (or another creator is making it).
        UntrustedStoreError: the run directory (or ``runs/``) is a link.
    """
    env.make_dirs(runs_dir)
    refuse_linked_dirs(runs_dir, paths)
    if os.path.lexists(paths.dir):
        _clear_unfinished(paths, runs_dir, env)
    building = RunPaths(paths.run_id, fsio.temp_path(runs_dir, paths.run_id))
    env.make_dir(building.dir, sync_parent=False)
    try:
        lock = acquire_lock(building, 0.0)
    except BaseException:
        with contextlib.suppress(OSError):
            env.remove_temp_entry(building.dir)
        raise
    return NewRunDir(paths, building, lock, env)


def _clear_unfinished(paths: RunPaths, runs_dir: Path, env: fsio.Env) -> None:
    """Move aside and remove the meta-less directory of a creation an older version left
    unfinished, or raise RunExistsError."""
    try:
        names = os.listdir(paths.dir)
    except FileNotFoundError:
        return  # cleared by another creator just now
    leftovers = all(n == LOCK_NAME or n.startswith(fsio.TEMP_PREFIX) for n in names)
    if not leftovers or lock_is_held(paths.lock):
        raise RunExistsError(paths.run_id, str(paths.dir))
    trash = fsio.temp_path(runs_dir, f"deleted-{paths.run_id}")
    try:
        env.rename(paths.dir, trash)
    except FileNotFoundError:
        return
    env.remove_temp_entry(trash)


def new_run_meta(
    run_id: str,
    *,
    thread_id: str | None = None,
    entrypoint: str | None = None,
    params: Any = None,
    parent_run_id: str | None = None,
    code_fingerprint: str | None = None,
    version: str | None = None,
    extra: dict[str, Any] | None = None,
) -> RunMeta:
    """The ``run.meta`` of a run that has never run (status ``created``)."""
    if parent_run_id is not None:
        validate_run_id(parent_run_id)
    stamp = now_ms()
    return RunMeta(
        run_id=run_id,
        thread_id=thread_id,
        created_ms=stamp,
        updated_ms=stamp,
        entrypoint=entrypoint,
        params=params,
        parent_run_id=parent_run_id,
        code_fingerprint=code_fingerprint,
        version=version,
        extra=extra or {},
    )


__all__ = ["NewRunDir", "begin_run_dir", "new_run_meta", "refuse_linked_dirs"]
