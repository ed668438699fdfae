"""A run's lease on a remote: which store may write it, moved only by create-only puts.

Epoch ``e`` of run ``R`` is the object ``R/lease/<e>.lease``, created with
``If-None-Match: *`` (an exclusive link on a local directory) and never changed.
The lease with the highest epoch wins: its ``owner`` (a store id) is the only store
that may publish the run. Taking a run creates epoch ``max + 1``; of two stores
racing for it, exactly one create succeeds. No backend needs If-Match, so the
same protocol works on S3, GCS, Azure and obstore's local-directory backend.

A lease also records where its epoch starts: the seq and the journal length the
taker pulled (``base_seq``, ``journal_base``) and the ``run.meta`` it took over.
Objects of an older epoch past those bases are what its owner uploaded after the
lease moved: readers ignore them, so a late upload never shadows the new owner's.
"""

from __future__ import annotations

import logging
import socket

import msgspec

from afk_local.errors import LeaseLostError, MirrorError
from afk_local.integrations.remote.bucket import Bucket
from afk_local.integrations.remote.identity import is_store_id
from afk_local.integrations.remote.layout import (
    MAX_EPOCH,
    MAX_LEASE_BYTES,
    lease_dir,
    lease_key,
    parse_run_key,
)
from afk_local.storage.format.records import now_ms

log = logging.getLogger("afk_local")

LEASE_FORMAT = "afk-local-lease"
MAX_LEASES = 100_000
_MAX_SEQ = 10**12 - 1
_MAX_OFFSET = 1 << 62


class Lease(msgspec.Struct, kw_only=True, frozen=True):
    """One epoch of a run's lease (the JSON body of ``<run>/lease/<epoch>.lease``)."""

    format: str = LEASE_FORMAT
    run_id: str
    epoch: int
    owner: str
    """The id of the store that holds this epoch (``<root>/store.id``)."""
    host: str = ""
    """The host the owner was on when it took the lease (for people only)."""
    taken_ms: int = 0
    base_seq: int = 0
    """The newest seq of the run as the taker pulled it: this epoch's seqs are above it."""
    journal_base: int = 0
    """The length of ``effects.log`` the taker pulled: this epoch appends after it."""
    meta: bytes | None = None
    """The ``run.meta`` file the taker pulled (None for epoch 1)."""


def new_lease(
    run_id: str,
    epoch: int,
    owner: str,
    *,
    base_seq: int = 0,
    journal_base: int = 0,
    meta: bytes | None = None,
) -> Lease:
    """A lease record for ``owner`` at ``epoch``."""
    return Lease(
        run_id=run_id,
        epoch=epoch,
        owner=owner,
        host=socket.gethostname()[:255],
        taken_ms=now_ms(),
        base_seq=base_seq,
        journal_base=journal_base,
        meta=meta,
    )


def decode_lease(data: bytes, run_id: str, epoch: int, url: str) -> Lease:
    """Decode and check a lease object read from the remote.

    Raises:
        MirrorError: it is not a lease of ``run_id`` at ``epoch``, or a field is out of range.
    """
    try:
        lease = msgspec.json.decode(data, type=Lease)
    except msgspec.DecodeError as exc:
        raise MirrorError(url, f"{lease_key(run_id, epoch)} is not a lease: {exc}") from None
    problem = None
    if lease.format != LEASE_FORMAT:
        problem = f"format {lease.format!r}"
    elif lease.run_id != run_id or lease.epoch != epoch:
        problem = f"it names run {lease.run_id!r} epoch {lease.epoch}"
    elif not is_store_id(lease.owner):
        problem = "its owner is not a store id"
    elif not (0 <= lease.base_seq <= _MAX_SEQ and 0 <= lease.journal_base <= _MAX_OFFSET):
        problem = "its bases are out of range"
    elif len(lease.host) > 255:
        problem = "its host name is too long"
    if problem is not None:
        raise MirrorError(url, f"{lease_key(run_id, epoch)} is not a valid lease: {problem}")
    return lease


def encode_lease(lease: Lease) -> bytes:
    """The JSON bytes of a lease."""
    return msgspec.json.encode(lease)


def read_leases(bucket: Bucket, run_id: str) -> dict[int, Lease]:
    """Every lease of the run by epoch (empty when the remote does not know the run).

    Raises:
        MirrorError: a lease object is damaged, or the epochs are not 1..N without a gap.
    """
    epochs = []
    for listed in bucket.list_objects(lease_dir(run_id), limit=MAX_LEASES):
        parsed = parse_run_key(listed.key[len(run_id) + 1 :])
        if parsed is not None and parsed.kind == "lease":
            epochs.append(parsed.epoch)
    epochs.sort()
    if epochs and epochs != list(range(1, len(epochs) + 1)):
        raise MirrorError(
            bucket.url, f"run {run_id}: lease epochs {epochs[:5]}... are not 1..N: refused"
        )
    leases = {}
    for epoch in epochs:
        data = bucket.get(lease_key(run_id, epoch), MAX_LEASE_BYTES)
        if data is None:
            raise MirrorError(bucket.url, f"{lease_key(run_id, epoch)} vanished while read")
        leases[epoch] = decode_lease(data, run_id, epoch, bucket.url)
    return leases


def create_lease(bucket: Bucket, lease: Lease) -> bool:
    """Create the lease object; False if that epoch exists already (someone else won)."""
    if not 0 < lease.epoch <= MAX_EPOCH:
        raise ValueError(f"epoch {lease.epoch} out of range")
    return bucket.create(lease_key(lease.run_id, lease.epoch), encode_lease(lease))


def superseded(bucket: Bucket, run_id: str, epoch: int) -> bool:
    """True when a newer epoch than ``epoch`` exists: the lease has moved on.

    Epochs are only ever created as ``max + 1``, so checking ``epoch + 1`` is enough.
    """
    return bucket.exists(lease_key(run_id, epoch + 1))


def lease_lost(bucket: Bucket, run_id: str, lease: Lease, my_epoch: int | None) -> LeaseLostError:
    """The error for a run whose newest lease is ``lease``, held by another store."""
    mine = f"this store's epoch {my_epoch} was superseded: " if my_epoch else ""
    return LeaseLostError(
        run_id,
        bucket.url,
        f"{mine}store {lease.owner[:12]} (host {lease.host or '?'}) holds the lease at "
        f"epoch {lease.epoch}",
    )


__all__ = [
    "LEASE_FORMAT",
    "Lease",
    "create_lease",
    "decode_lease",
    "encode_lease",
    "lease_lost",
    "new_lease",
    "read_leases",
    "superseded",
]
