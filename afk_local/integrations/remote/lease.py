"""A run's lease on a remote: which store may write it, moved only by create-only puts.

Epoch ``e`` of run ``R`` is the object ``R/lease/<e>.lease``, created with
``If-None-Match: *`` (an exclusive link on a local directory) and never changed.
The lease with the highest epoch wins: its ``owner`` (a store id) is the only store
that may publish the run. Taking a run creates epoch ``max + 1``; of two stores
racing for it, exactly one create succeeds. No backend needs If-Match, so the
same protocol works on S3, GCS, Azure and obstore's local-directory backend.

The take protocol (docs/remote.md): the taker creates the lease FIRST, then lists
the old epoch, then records where its epoch starts in a create-only bases object
``R/lease/<e>.bases``: the seq and the journal length it pulled (``base_seq``,
``journal_base``) and the ``run.meta`` it took over. Objects of an older epoch past
those bases are what its owner uploaded after the lease moved: readers ignore them,
so a late upload never shadows the new owner's. An epoch without bases is a take
that has not finished (its owner uploads nothing until it has). In a keyed store
lease and bases objects carry an HMAC line (:meth:`Signer.sign_document`) and
unsigned ones are refused. While it runs, a holder replaces ``R/lease/<e>.alive``
every few seconds; a taker refuses to fence a background-mirrored owner that
renewed within its lease period unless forced.
"""

from __future__ import annotations

import logging
import socket

import msgspec

from afk_local.errors import LeaseLostError, MirrorError, RemoteIntegrityError
from afk_local.integrations.remote.bucket import Bucket
from afk_local.integrations.remote.identity import is_store_id
from afk_local.integrations.remote.layout import (
    MAX_EPOCH,
    MAX_LEASE_BYTES,
    alive_key,
    bases_key,
    lease_dir,
    lease_key,
    parse_run_key,
)
from afk_local.storage.format.integrity import Signer, split_document
from afk_local.storage.format.records import now_ms

log = logging.getLogger("afk_local")

LEASE_FORMAT = "afk-local-lease"
BASES_FORMAT = "afk-local-bases"
DEFAULT_LEASE_S = 30.0
"""A holder that has not renewed for this long has let its lease lapse."""
MARGIN_FRACTION = 0.25
"""The safety margin, as a fraction of the lease period: a holder fences itself once its
last renewal is older than ``lease_s - margin`` by its own clock; a taker waits until it
is older than ``lease_s + margin`` (plus :data:`TIMESTAMP_RESOLUTION_MS`) by the remote's."""
TIMESTAMP_RESOLUTION_MS = 1000
"""How coarse a remote's object timestamps may be (S3's ``Last-Modified``: whole seconds)."""
REVIVAL_WAIT_S = 1.0
"""A background-mirrored holder renewing at its session's start or after a lapse waits this
long (a second renewal and lease check) before its next effect; a taker whose lease create
ends this long after its last read of the renewal, which changed since, waits for the
holder's lease to lapse before it lists (docs/remote.md, "Revivals")."""
MAX_REVIVAL_WAITS = 4
"""How many lapse periods such a taker waits for the holder to stop renewing."""
MAX_ALIVE_BYTES = 4096
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
    """The ``run.meta`` file the taker pulled (None for epoch 1, and until its bases exist)."""

    @property
    def settled(self) -> bool:
        """False for a taken epoch whose bases object does not exist yet (a take in progress)."""
        return self.epoch == 1 or self.meta is not None


class Bases(msgspec.Struct, kw_only=True, frozen=True):
    """Where a taken epoch starts (``<run>/lease/<epoch>.bases``), written after the take read
    the old epoch."""

    format: str = BASES_FORMAT
    run_id: str
    epoch: int
    base_seq: int
    journal_base: int
    meta: bytes


RENEWAL_FORMAT = "afk-local-renewal"


class Renewal(msgspec.Struct, kw_only=True, frozen=True):
    """The body of ``<run>/lease/<epoch>.alive``: how its holder mirrors, and its period."""

    format: str = RENEWAL_FORMAT
    run_id: str = ""
    epoch: int = 0
    sync_effects: bool
    lease_ms: int
    released: bool = False
    """True once the holder closed the run: nothing of it runs any more."""
    session: str = ""
    """A random id of the writer session that renews (a new one each time the run opens)."""
    counter: int = 0
    """How many renewals the session wrote before this one: a replay repeats an old one."""
    journal_end: int = -1
    """The journal length the holder had confirmed on the remote (-1: not said): a remote
    journal shorter than that was rolled back."""
    head_seq: int = -1
    """The newest seq the holder had confirmed on the remote (-1: not said)."""
    meta_version: int = -1
    """(release) the newest run.meta version the session left (-1: not said): a release
    whose pins no longer match the remote is an old one, replayed."""


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


def _open(data: bytes, tag: str, key: str, url: str, signer: Signer | None) -> bytes:
    if signer is None:
        return split_document(data)[0]
    try:
        return signer.open_document(tag, data)
    except ValueError as exc:
        raise RemoteIntegrityError(
            url, f"{key}: {exc}: refused, nothing was published (a keyed store signs its leases)"
        ) from None


def _seal(body: bytes, tag: str, signer: Signer | None) -> bytes:
    return body if signer is None else signer.sign_document(tag, body)


def decode_lease(
    data: bytes, run_id: str, epoch: int, url: str, signer: Signer | None = None
) -> Lease:
    """Decode and check a lease object read from the remote (its MAC in a keyed store).

    Raises:
        MirrorError: it is not a lease of ``run_id`` at ``epoch``, or a field is out of range,
            or (keyed) it is unsigned or signed with another key.
    """
    data = _open(data, LEASE_FORMAT, lease_key(run_id, epoch), url, signer)
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


def encode_lease(lease: Lease, signer: Signer | None = None) -> bytes:
    """The JSON bytes of a lease (followed by its MAC line in a keyed store)."""
    return _seal(msgspec.json.encode(lease), LEASE_FORMAT, signer)


def encode_bases(bases: Bases, signer: Signer | None = None) -> bytes:
    """The JSON bytes of a bases object (followed by its MAC line in a keyed store)."""
    return _seal(msgspec.json.encode(bases), BASES_FORMAT, signer)


def decode_bases(
    data: bytes, run_id: str, epoch: int, url: str, signer: Signer | None = None
) -> Bases:
    """Decode and check a bases object read from the remote.

    Raises:
        MirrorError: damaged, of another run or epoch, out of range, or (keyed) not signed.
    """
    key = bases_key(run_id, epoch)
    data = _open(data, BASES_FORMAT, key, url, signer)
    try:
        bases = msgspec.json.decode(data, type=Bases)
    except msgspec.DecodeError as exc:
        raise MirrorError(url, f"{key} is not a bases object: {exc}") from None
    if (
        bases.format != BASES_FORMAT
        or bases.run_id != run_id
        or bases.epoch != epoch
        or not (0 <= bases.base_seq <= _MAX_SEQ and 0 <= bases.journal_base <= _MAX_OFFSET)
    ):
        raise MirrorError(url, f"{key} is not a valid bases object of run {run_id}: refused")
    return bases


def read_leases(bucket: Bucket, run_id: str, signer: Signer | None = None) -> dict[int, Lease]:
    """Every lease of the run by epoch, with its bases when recorded (empty: run unknown).

    Raises:
        MirrorError: a lease or bases object is damaged or (keyed) unsigned, or the
            epochs are not 1..N without a gap.
        RemoteIntegrityError: a taken epoch's bases lie before the previous epoch's.
    """
    epochs = []
    with_bases = set()
    for listed in bucket.list_objects(lease_dir(run_id), limit=MAX_LEASES):
        parsed = parse_run_key(listed.key[len(run_id) + 1 :])
        if parsed is not None and parsed.kind == "lease":
            epochs.append(parsed.epoch)
        elif parsed is not None and parsed.kind == "bases":
            with_bases.add(parsed.epoch)
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
        lease = decode_lease(data, run_id, epoch, bucket.url, signer)
        if epoch > 1 and epoch in with_bases:
            raw = bucket.get(bases_key(run_id, epoch), MAX_LEASE_BYTES)
            if raw is None:
                raise MirrorError(bucket.url, f"{bases_key(run_id, epoch)} vanished while read")
            bases = decode_bases(raw, run_id, epoch, bucket.url, signer)
            lease = msgspec.structs.replace(
                lease, base_seq=bases.base_seq, journal_base=bases.journal_base, meta=bases.meta
            )
        leases[epoch] = lease
    _check_bases_grow(bucket.url, run_id, leases)
    return leases


def _check_bases_grow(url: str, run_id: str, leases: dict[int, Lease]) -> None:
    """Each taken epoch starts where the run stood when it was taken, which is never
    before where the previous settled epoch started: bases that go back would drop that
    epoch's work (a forged lease in an unkeyed store, say)."""
    previous: Lease | None = None
    for epoch in sorted(leases):
        lease = leases[epoch]
        if not lease.settled:
            continue
        if previous is not None and (
            lease.base_seq < previous.base_seq or lease.journal_base < previous.journal_base
        ):
            raise RemoteIntegrityError(
                url,
                f"run {run_id}: epoch {epoch} starts at seq {lease.base_seq}, journal byte "
                f"{lease.journal_base}, before epoch {previous.epoch} did ({previous.base_seq}, "
                f"{previous.journal_base}): the lease chain goes back (a forged lease?): refused",
            )
        previous = lease


def create_lease(bucket: Bucket, lease: Lease, signer: Signer | None = None) -> bool:
    """Create the lease object; False if that epoch exists already (someone else won)."""
    if not 0 < lease.epoch <= MAX_EPOCH:
        raise ValueError(f"epoch {lease.epoch} out of range")
    return bucket.create(lease_key(lease.run_id, lease.epoch), encode_lease(lease, signer))


def create_bases(bucket: Bucket, bases: Bases, signer: Signer | None = None) -> bool:
    """Create the bases object of a taken epoch; False if it exists already."""
    return bucket.create(bases_key(bases.run_id, bases.epoch), encode_bases(bases, signer))


def safety_margin_ms(lease_ms: int) -> int:
    """The safety margin of a lease period (both in ms): :data:`MARGIN_FRACTION` of it."""
    return int(lease_ms * MARGIN_FRACTION)


def renew(
    bucket: Bucket,
    run_id: str,
    epoch: int,
    *,
    sync_effects: bool,
    lease_s: float,
    session: str = "",
    counter: int = 0,
    released: bool = False,
    journal_end: int = -1,
    head_seq: int = -1,
    meta_version: int = -1,
    signer: Signer | None = None,
) -> None:
    """Replace the holder's renewal object of ``epoch`` (the server stamps its time),
    with what the holder has confirmed on the remote (``journal_end``, ``head_seq``;
    ``meta_version`` too when ``released``, once the holder closed the run). Signed in a
    keyed store."""
    body = Renewal(
        run_id=run_id,
        epoch=epoch,
        sync_effects=sync_effects,
        lease_ms=int(lease_s * 1000),
        released=released,
        session=session,
        counter=counter,
        journal_end=journal_end,
        head_seq=head_seq,
        meta_version=meta_version,
    )
    bucket.replace(
        alive_key(run_id, epoch), _seal(msgspec.json.encode(body), RENEWAL_FORMAT, signer)
    )


def last_renewal(
    bucket: Bucket, run_id: str, epoch: int, signer: Signer | None = None
) -> tuple[Renewal, int] | None:
    """The holder's renewal of ``epoch`` and how long ago it was written (ms, by this
    machine's clock against the server's stamp); None when it never renewed (or, in an
    unkeyed store, when the object is not a renewal of this run and epoch).

    Raises:
        RemoteIntegrityError: (keyed) the renewal is unsigned or signed with another key:
            a forged "released" must not let a take fence a live owner.
    """
    key = alive_key(run_id, epoch)
    modified = bucket.modified_ms(key)
    data = bucket.get(key, MAX_ALIVE_BYTES) if modified is not None else None
    if modified is None or data is None:
        return None
    body = _open(data, RENEWAL_FORMAT, key, bucket.url, signer)
    try:
        renewal = msgspec.json.decode(body, type=Renewal)
    except msgspec.DecodeError:
        renewal = None
    if renewal is None or (renewal.format, renewal.run_id, renewal.epoch) != (
        RENEWAL_FORMAT,
        run_id,
        epoch,
    ):
        if signer is not None:
            raise RemoteIntegrityError(bucket.url, f"{key} is not a renewal of this run: refused")
        return None
    return renewal, max(0, now_ms() - modified)


def check_chain(bucket: Bucket, run_id: str, epoch: int, owner: str, signer: Signer | None) -> None:
    """The holder's check that its own link of the lease chain still stands: its lease
    object there and still naming it, its bases object there (epoch > 1). A newer epoch
    is :func:`superseded`'s to see.

    Raises:
        RemoteIntegrityError: this epoch's lease or bases object is gone or names another
            owner: the remote was damaged or tampered with; the run stops here as a taker
            of it would refuse it.
    """
    key = lease_key(run_id, epoch)
    data = bucket.get(key, MAX_LEASE_BYTES)
    problem = None
    if data is None:
        problem = f"{key} (this store's lease) is gone"
    elif decode_lease(data, run_id, epoch, bucket.url, signer).owner != owner:
        problem = f"{key} now names another owner"
    elif epoch > 1 and not bucket.exists(bases_key(run_id, epoch)):
        problem = f"{bases_key(run_id, epoch)} (this epoch's bases) is gone"
    if problem is not None:
        raise RemoteIntegrityError(
            bucket.url,
            f"run {run_id}: {problem}: the lease chain is broken (the remote was damaged or "
            "tampered with); the run stops here and takes of it are refused",
        )


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
    "BASES_FORMAT",
    "DEFAULT_LEASE_S",
    "LEASE_FORMAT",
    "MARGIN_FRACTION",
    "MAX_REVIVAL_WAITS",
    "RENEWAL_FORMAT",
    "REVIVAL_WAIT_S",
    "TIMESTAMP_RESOLUTION_MS",
    "Bases",
    "Lease",
    "Renewal",
    "check_chain",
    "create_bases",
    "create_lease",
    "decode_bases",
    "decode_lease",
    "encode_bases",
    "encode_lease",
    "last_renewal",
    "lease_lost",
    "new_lease",
    "read_leases",
    "renew",
    "safety_margin_ms",
    "superseded",
]
