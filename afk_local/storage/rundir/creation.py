"""Creating a run directory: refusing links out of the store, the directory made
durable, and the ``run.meta`` of a run that has never run.

The writer's lock and the first meta write are :func:`~.writer.open_writer`'s; this
module owns what comes before them, so that :class:`~afk_local.Store` only wires it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from afk_local.errors import RunExistsError, UntrustedStoreError
from afk_local.storage import fsio
from afk_local.storage.format.layout import RunPaths, validate_run_id
from afk_local.storage.format.records import RunMeta, now_ms
from afk_local.storage.rundir.ownership import lock_is_held


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


def make_run_dir(paths: RunPaths, runs_dir: Path, env: fsio.Env = fsio.DEFAULT_ENV) -> None:
    """Make the directory of a new run durable (through the store's ``env``).

    A crash between ``mkdir`` and the first ``run.meta`` leaves a directory with no
    meta and no owner: it is adopted, or that run id could never be used again
    (``open_writer`` checks again under the lock: another creator may be just ahead).
    The crash may also have come before mkdir's parent fsync, so that is made again.

    Raises:
        RunExistsError: the run has a meta, or a live owner, already.
        UntrustedStoreError: the run directory (or ``runs/``) is a link.
    """
    env.make_dirs(runs_dir)
    refuse_linked_dirs(runs_dir, paths)
    try:
        env.make_dir(paths.dir)
    except FileExistsError:
        refuse_linked_dirs(runs_dir, paths)  # never adopt through a symlink
        if os.path.lexists(paths.meta) or lock_is_held(paths.lock):
            raise RunExistsError(paths.run_id, str(paths.dir)) from None
        env.fsync_dir(runs_dir)


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


__all__ = ["make_run_dir", "new_run_meta", "refuse_linked_dirs"]
