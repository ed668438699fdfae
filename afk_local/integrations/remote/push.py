"""``afk-local push``: upload runs that are not being written, incrementally.

A push holds the run's ``owner.lock`` while it uploads, so it only ever sends what a
finished (or interrupted) writer acknowledged; a run whose owner is alive is
mirrored by that owner (``Store(mirror=...)``) or pushed once it stops.
"""

from __future__ import annotations

from afk_local.errors import RunNotFoundError
from afk_local.integrations.remote.bucket import Bucket
from afk_local.integrations.remote.identity import store_id
from afk_local.integrations.remote.upload import PushReport, RunUploader
from afk_local.storage.rundir.ownership import acquire_lock
from afk_local.storage.store import Store


def push_run(store: Store, url: str | Bucket, run_id: str, *, concurrency: int = 16) -> PushReport:
    """Upload what the remote lacks of run ``run_id``; safe to repeat, and after a kill.

    Raises:
        RunNotFoundError: no such run in ``store``.
        RunLockedError: the run is open for writing.
        LeaseLostError: another store holds the run's lease.
        MirrorError: a request failed.
    """
    bucket = url if isinstance(url, Bucket) else Bucket(url)
    paths = store.paths(run_id)
    if not paths.meta.is_file():
        raise RunNotFoundError(run_id, str(store.root))
    lock = acquire_lock(paths, 0.0)
    try:
        uploader = RunUploader(bucket, paths, store_id(store.root), store.codec.signer)
        return uploader.push(concurrency=concurrency)
    finally:
        lock.release()


__all__ = ["push_run"]
