"""Remote mirror of runs on object storage (``pip install 'afk_local[remote]'``, obstore).

Three ways in:

- ``Store(root, mirror="s3://bucket/prefix")`` (or ``$AFK_LOCAL_MIRROR``): every
  checkpoint and journal record a writer acknowledges is uploaded in the background
  (:mod:`.mirror`); the store finds this package through the ``afk_local.mirrors``
  entry points, never by a static import from the core.
- :func:`push_run` / :func:`pull_run` / :func:`take_run` / :func:`remote_runs`:
  ``afk-local push``, ``pull [--take]`` and ``runs --remote`` as functions.
- :class:`Bucket`: the remote location itself (S3, GCS, Azure, a local directory).

Objects, the lease protocol and the guarantees are in docs/remote.md.

Example:
    >>> import afk_local as afk, tempfile
    >>> from afk_local.integrations.remote import push_run, pull_run
    >>> bucket = "file://" + tempfile.mkdtemp()
    >>> a, b = afk.Store(tempfile.mkdtemp()), afk.Store(tempfile.mkdtemp())
    >>> with a.create("doc-run") as run:
    ...     _ = run.checkpoint("runtime_state", {"n": 1}, step=1)
    >>> push_run(a, bucket, "doc-run").files
    1
    >>> pull_run(b, bucket, "doc-run", take=True).took
    True
    >>> b.open("doc-run").latest().payload
    {'n': 1}
"""

from __future__ import annotations

from afk_local.integrations.remote.bucket import Bucket, BucketRequestError, file_url
from afk_local.integrations.remote.identity import existing_store_id, store_id
from afk_local.integrations.remote.lease import Lease
from afk_local.integrations.remote.listing import RemoteRunInfo, remote_runs
from afk_local.integrations.remote.mirror import RemoteMirror, RunMirrorThread, open_remote_mirror
from afk_local.integrations.remote.pull import (
    PullReport,
    RemoteIntegrityError,
    pull_run,
    take_run,
)
from afk_local.integrations.remote.push import push_run
from afk_local.integrations.remote.upload import PushReport
from afk_local.integrations.remote.workers import MirroredWorkers

__all__ = [
    "Bucket",
    "BucketRequestError",
    "Lease",
    "MirroredWorkers",
    "PullReport",
    "PushReport",
    "RemoteIntegrityError",
    "RemoteMirror",
    "RemoteRunInfo",
    "RunMirrorThread",
    "existing_store_id",
    "file_url",
    "open_remote_mirror",
    "pull_run",
    "push_run",
    "remote_runs",
    "store_id",
    "take_run",
]
