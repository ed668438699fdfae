"""What a deleted run leaves behind: its effect journal, unless asked otherwise.

``afk-local rm RUN`` deletes a run but keeps the record of the side effects it had
(which calls ran, with which idempotency keys and results): that is what an
outside system may need to be reconciled with later. :func:`keep_journal` puts the
run's ``effects.log`` and ``run.meta`` into ``<root>/removed/<run_id>.<UTC time>/``
(hard links where the filesystem allows, copies otherwise), durably, before the
run directory goes (docs/format.md, "Removed runs").
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

from afk_local.storage import fsio
from afk_local.storage.format.layout import RunPaths

REMOVED_DIR = "removed"
"""``<root>/removed``: the journals of runs deleted with ``afk-local rm``."""

_LINK_REFUSED = (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP)
_MAX_COPY_BYTES = 1 << 40


def keep_journal(paths: RunPaths, root: Path, env: fsio.Env = fsio.DEFAULT_ENV) -> Path | None:
    """Keep the run's journal and meta under ``root/removed/``; returns where (None: none).

    Call it holding the run's lock, before the run directory is deleted: when it
    returns, the kept files and their directory entries are durable.
    """
    if not paths.journal.is_file():
        return None
    removed = root / REMOVED_DIR
    env.make_dirs(removed)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = removed / f"{paths.run_id}.{stamp}"
    suffix = 1
    while not env.make_dir(target, exist_ok=True):  # durable in removed/ once made
        suffix += 1
        target = removed / f"{paths.run_id}.{stamp}.{suffix}"
    # effects.log's bytes are durable already (every record is fsynced before it is
    # acknowledged); run.meta's may not be (a completed run's, see _link_or_copy).
    for source, durable in ((paths.journal, True), (paths.meta, False)):
        if source.is_file():
            _link_or_copy(source, target / source.name, env, durable=durable)
    env.fsync_dir(target)
    return target


def _link_or_copy(src: Path, dst: Path, env: fsio.Env, *, durable: bool) -> None:
    """Keep ``src`` as ``dst``, its bytes durable before its source can go.

    A hard link shares bytes that may never have been fsynced (a completed run's
    ``run.meta`` is not: its terminal checkpoint carries a copy, and that checkpoint goes
    with the run), so the kept file is fsynced too, unless ``durable`` says its bytes
    are durable already: a kept file is a promise of its own.
    """
    try:
        env.hard_link(src, dst)
    except OSError as exc:
        if exc.errno not in _LINK_REFUSED:
            raise
        env.write_new_file(dst, fsio.read_bounded(src, _MAX_COPY_BYTES))
        return
    if durable:
        return
    fd = fsio.open_regular(dst)
    try:
        env.fsync_fd(fd, dst)
    finally:
        os.close(fd)


__all__ = ["REMOVED_DIR", "keep_journal"]
