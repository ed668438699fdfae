"""Fan-out without a shared filesystem: each worker a local store mirrored to one remote.

:class:`MirroredWorkers` is what ``map_durable(..., store=MirroredWorkers(url))``
sends to every task (:mod:`afk_local.integrations.dask`, :mod:`~afk_local.integrations.ray`).
On the worker, a task opens a local store mirrored to ``url``; if the remote knows
the run (an earlier attempt on another machine), the task first takes it
(``pull --take``: the lease moves here and the old owner is fenced), then runs
it; the writer's close waits for the mirror. A run the remote holds as completed is
never taken: a worker that has it completed already uses its own copy (nothing is
downloaded, no lease moves), another pulls a read-only copy to return its result.
Effects are mirrored synchronously
(``sync_effects``): a step's intent is in the remote before its function runs,
so a worker whose machine dies loses no effect — the next worker replays what
finished and reports what was in flight as in doubt. Checkpoints are mirrored in
the background: a machine lost mid-run costs at most the steps since the last
uploaded one, redone from there.

It satisfies :class:`afk_local.integrations.fanout.WorkerStore` structurally, so
this package does not import the fan-out one.
"""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path
from typing import Any

from afk_local.integrations.remote.bucket import Bucket
from afk_local.integrations.remote.listing import remote_run_info
from afk_local.integrations.remote.mirror import RemoteMirror
from afk_local.integrations.remote.pull import pull_run, take_run
from afk_local.storage.format.codec import DecHook, EncHook
from afk_local.storage.format.records import RunStatus
from afk_local.storage.store import Store

_OPTIONS = frozenset({"max_record_bytes", "lock_timeout", "max_chain"})


class MirroredWorkers:
    """A fan-out's store when workers share nothing but a remote (``s3://``, ``file://``...).

    Only the URL, the local directory and the store's options travel to the
    workers, never a key: a keyed store's workers read ``$AFK_LOCAL_KEY`` from
    their own environment. Remote credentials come from each worker's
    environment too (``AWS_*``, as for ``Store(mirror=URL)``).

    Args:
        url: the remote every worker mirrors to and takes runs from.
        local_root: each worker's local store. Default: a directory per worker
            process under the temp directory (``afk-local-workers/<host>-<pid>``), so
            two processes of one machine behave like two machines.
        enc_hook / dec_hook / max_record_bytes / lock_timeout / max_chain: as for
            :class:`~afk_local.Store`.

    Example:
        >>> from afk_local.integrations.remote import MirroredWorkers
        >>> MirroredWorkers("s3://bucket/afk")
        MirroredWorkers('s3://bucket/afk')
    """

    def __init__(
        self,
        url: str,
        *,
        local_root: str | os.PathLike[str] | None = None,
        enc_hook: EncHook | None = None,
        dec_hook: DecHook | None = None,
        **options: Any,
    ) -> None:
        unknown = set(options) - _OPTIONS
        if unknown:
            raise TypeError(
                f"MirroredWorkers takes {', '.join(sorted(_OPTIONS))}, not "
                f"{', '.join(sorted(unknown))} (a key is never sent to workers: set "
                "AFK_LOCAL_KEY in their environment)"
            )
        Bucket(url)  # a malformed URL or a missing extra fails here, on the client
        self.url = url
        self.local_root = None if local_root is None else str(Path(local_root).absolute())
        self.enc_hook = enc_hook
        self.dec_hook = dec_hook
        self.options = dict(options)

    def __repr__(self) -> str:
        return f"MirroredWorkers({self.url!r})"

    def root(self) -> Path:
        """This worker's local store directory."""
        if self.local_root is not None:
            return Path(self.local_root)
        return Path(
            tempfile.gettempdir(), "afk-local-workers", f"{socket.gethostname()}-{os.getpid()}"
        )

    def open(self) -> Store:
        """The worker's local store, mirroring every run it writes to the remote."""
        root = self.root()
        return Store(
            root,
            enc_hook=self.enc_hook,
            dec_hook=self.dec_hook,
            mirror=RemoteMirror(self.url, root=root, sync_effects=True),
            **self.options,
        )

    def prepare(self, store: Store, run_id: str) -> None:
        """Take the run from the remote when an earlier attempt left it there unfinished;
        a completed one is only copied here, and only when this worker lacks it."""
        bucket = Bucket(self.url)
        info = remote_run_info(bucket, run_id, store.codec)
        if info is None:
            return
        if info.status == RunStatus.COMPLETED.value:
            paths = store.paths(run_id)
            if paths.meta.is_file() and store.read_meta(run_id).status is RunStatus.COMPLETED:
                return
            pull_run(store, bucket, run_id)
            return
        take_run(store, run_id, bucket)

    def release(self, store: Store, run_id: str) -> None:
        """Nothing: the run's writer waited for the mirror when it closed."""


__all__ = ["MirroredWorkers"]
