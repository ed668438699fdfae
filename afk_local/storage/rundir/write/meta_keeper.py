"""``run.meta`` while a writer holds the run: the meta of a new attempt, and its changes.

Opening a run for writing starts an attempt: a new run's meta, or the run's meta with
this process as owner and (unless the write is not an attempt to run it) ``attempt``
+ 1 (:func:`attempt_meta`). A run pulled from a remote without ``--take`` and a keyed
run that is behind its head record are refused first. From then on every change
replaces ``run.meta`` atomically, with ``updated_ms`` strictly increasing, and is told
to the head record and the mirror once durable (:class:`MetaKeeper`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import msgspec

from afk_local.errors import LeaseLostError, RunExistsError
from afk_local.storage.format import codec
from afk_local.storage.format.codec import RecordCodec
from afk_local.storage.format.layout import RunPaths
from afk_local.storage.format.records import OwnerInfo, RunMeta, later_ms
from afk_local.storage.fsio import DEFAULT_ENV, Env
from afk_local.storage.rundir.mirror import REMOTE_COPY_KEY, RunMirror, refuse_fenced
from afk_local.storage.rundir.read.heads import HeadKeeper, HeadStore
from afk_local.storage.rundir.read.reader import read_meta
from afk_local.storage.rundir.run_changes import tell_meta


def attempt_meta(
    paths: RunPaths,
    record_codec: RecordCodec,
    *,
    owner: OwnerInfo,
    new_meta: RunMeta | None = None,
    new_attempt: bool = True,
    heads: HeadStore | None = None,
) -> RunMeta:
    """The ``run.meta`` the attempt that just took the run's lock writes first.

    With ``new_meta`` (a new run), that meta as attempt 1 of ``owner``, or, when
    ``new_attempt`` is False (a run made for another process to start), as attempt 0
    with no owner: its first start is then attempt 1. Else the run's meta with
    ``owner``, ``attempt`` + 1 unless ``new_attempt`` is False, and ``updated_ms``
    moved on.

    Raises:
        RunExistsError: ``new_meta`` was given but the run has a ``run.meta`` by now.
        LeaseLostError: the run is a copy pulled without ``--take``, or fenced (another
            store took its lease).
        RunRolledBackError: the run is behind its head record (``heads``, a keyed store).
    """
    if new_meta is not None:
        if os.path.lexists(paths.meta):
            raise RunExistsError(paths.run_id, str(paths.dir))
        if not new_attempt:
            return msgspec.structs.replace(new_meta, owner=None, attempt=0)
        return msgspec.structs.replace(new_meta, owner=owner, attempt=1)
    old = read_meta(paths, record_codec)
    _refuse_remote_copy(old)
    refuse_fenced(paths)
    if heads is not None:
        heads.require_not_behind(paths, lambda: old.updated_ms)  # under the lock
    attempt = old.attempt + 1 if new_attempt else old.attempt
    return msgspec.structs.replace(
        old, owner=owner, attempt=attempt, updated_ms=later_ms(old.updated_ms)
    )


def _refuse_remote_copy(meta: RunMeta) -> None:
    # A run pulled without --take is somebody else's: writing it here would fork its
    # history behind the lease holder's back (docs/remote.md).
    copy = meta.extra.get(REMOTE_COPY_KEY)
    if isinstance(copy, dict):
        raise LeaseLostError(
            meta.run_id,
            str(copy.get("url", "its remote")),
            f"this is a read-only copy pulled without --take (the lease is held by store "
            f"{copy.get('holder', '?')} at epoch {copy.get('epoch', '?')})",
        )


class MetaKeeper:
    """The run's ``run.meta`` as its writer changes it. Not thread-safe: the writer
    serialises the calls.

    Args:
        paths: the run directory.
        meta: the meta on disk now (the one the attempt wrote).
        record_codec: the store's codec (its key signs the meta).
        head: the run's head record, told of every durable meta (a keyed store).
        mirror: the run's remote mirror, told after every durable meta.
        on_failure: told of a failed write (the writer refuses further writes).
        on_disk: False for a new run not published yet (see :attr:`on_disk`).
    """

    def __init__(
        self,
        paths: RunPaths,
        meta: RunMeta,
        *,
        record_codec: RecordCodec,
        head: HeadKeeper | None = None,
        mirror: RunMirror | None = None,
        env: Env = DEFAULT_ENV,
        on_failure: Callable[[BaseException], None],
        on_disk: bool = True,
    ) -> None:
        self._env = env
        self.on_disk = on_disk
        """False while the run is not published: changes stay in memory, and the
        publish writes the meta as it is then."""
        self.paths = paths
        self.meta = meta
        """The run's current ``run.meta``."""
        self._codec = record_codec
        self._head = head
        self._mirror = mirror
        self._on_failure = on_failure

    def replace(self, **changes: Any) -> RunMeta:
        """Replace ``run.meta`` durably with ``changes`` applied (``updated_ms`` bumped).

        A value that cannot be encoded fails before any I/O; a failed write is handed
        to ``on_failure`` and raised.
        """
        meta, data = self.next(**changes)
        self.put(meta, data)
        return meta

    def next(self, **changes: Any) -> tuple[RunMeta, bytes]:
        """The meta with ``changes`` applied (``updated_ms`` bumped) and its encoding, not
        written yet: :meth:`put` writes it. A bad value fails here, before any I/O."""
        meta = msgspec.structs.replace(
            self.meta, updated_ms=later_ms(self.meta.updated_ms), **changes
        )
        return meta, codec.encode_meta(self._codec, meta)

    def put(self, meta: RunMeta, data: bytes) -> None:
        """Write ``meta`` (encoded as ``data`` by :meth:`next`) as ``run.meta``, durably:
        the head record and the mirror are told once it is."""
        self._write(meta, data, sync=True)

    def put_carried(self, meta: RunMeta, data: bytes) -> None:
        """Write ``meta`` as ``run.meta`` whose bytes a durable terminal checkpoint already
        carries (:data:`~afk_local.storage.format.records.META_COPY_KEY`): its rename is
        not made durable (nor its bytes, where no head record or mirror reads them), since
        a power cut that loses or tears it loses nothing (:func:`~.reader.read_meta` takes
        the copy). The head record may move at once: what it names is durable, in the
        checkpoint."""
        self._write(meta, data, sync=False)

    def _write(self, meta: RunMeta, data: bytes, *, sync: bool) -> None:
        if not self.on_disk:
            self.meta = meta
            return
        keep_bytes = sync or self._head is not None or self._mirror is not None
        try:
            self._env.atomic_write(self.paths.meta, data, sync_dir=sync, sync_file=keep_bytes)
        except BaseException as exc:
            self._on_failure(exc)
            raise
        self.meta = meta
        tell_meta(self.paths, meta, self._codec.signer, self._env)
        if self._head is not None:
            self._head.meta(meta.updated_ms)
        if self._mirror is not None:
            self._mirror.meta_replaced()


__all__ = ["MetaKeeper", "attempt_meta"]
