"""``<root>/runs.changes``: what the writers of a store's runs tell its listings and watchers.

Every writer that creates a run, replaces its ``run.meta`` (a status change, a finish, a
watcher's claim) or deletes it appends one record here: the run's meta summary with the
``stat`` of the ``run.meta`` it describes (a
:class:`~afk_local.storage.format.meta_index_file.MetaSummary`), or a deletion. So a
lister after 100,000 runs were created reads one file instead of 100,000 metas, and a
watcher learns of a change from one filesystem event on the store's root.

The file is a cache, like ``runs.index``, never the truth: records are appended with
``O_APPEND`` in one write and never fsynced (:func:`~afk_local.storage.fsio.append_unsynced`);
each is crc-framed, and signed in a keyed store. A reader (:mod:`afk_local.storage.meta_index`)
stops at the first record it cannot use, and trusts a record only while the ``run.meta``
it names still has the stat it carries. A record that a crash lost, or that was never
written (an older afk_local), costs a reader one re-read of that run. Telling never fails
the writer: an error is logged.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from afk_local.storage import fsio
from afk_local.storage.format.integrity import Signer
from afk_local.storage.format.layout import RunPaths
from afk_local.storage.format.meta_index_file import MetaSummary, encode_change
from afk_local.storage.format.records import RunMeta

log = logging.getLogger("afk_local")

CHANGES_NAME = "runs.changes"
"""The file in the store's root."""


def changes_path(root: Path) -> Path:
    """``<root>/runs.changes``."""
    return root / CHANGES_NAME


def summarise(meta: RunMeta, st: os.stat_result, dir_ino: int) -> MetaSummary:
    """What the index keeps of ``meta``, read from a ``run.meta`` whose stat is ``st``, in
    a run directory whose inode is ``dir_ino`` (the one definition, writers and readers)."""
    return MetaSummary(
        st.st_ino,
        st.st_mtime_ns,
        st.st_size,
        meta.status.value,
        meta.updated_ms,
        meta.entrypoint is not None,
        meta.next_attempt_ms,
        meta.created_ms,
        dir_ino,
    )


def tell_meta(
    paths: RunPaths, meta: RunMeta, signer: Signer | None, env: fsio.Env | None = None
) -> None:
    """Append ``meta``, just written as ``paths``' ``run.meta`` (in a published run
    directory), to the store's ``runs.changes``. Never raises."""
    try:
        st = os.stat(paths.meta, follow_symlinks=False)
        dir_ino = os.stat(paths.dir, follow_symlinks=False).st_ino
        record = encode_change(paths.run_id, summarise(meta, st, dir_ino), signer)
        fsio.append_unsynced(changes_path(paths.dir.parent.parent), record, env)
    except OSError as exc:
        log.debug("%s: not told of run %s (%s)", CHANGES_NAME, paths.run_id, exc)


def tell_gone(root: Path, run_id: str, signer: Signer | None, env: fsio.Env | None = None) -> None:
    """Append the deletion of run ``run_id`` (its directory has left ``runs/``). Never raises."""
    try:
        fsio.append_unsynced(changes_path(root), encode_change(run_id, None, signer), env)
    except OSError as exc:
        log.debug("%s: not told of run %s (%s)", CHANGES_NAME, run_id, exc)


__all__ = ["CHANGES_NAME", "changes_path", "summarise", "tell_gone", "tell_meta"]
