"""The steps of the take protocol that :func:`~.pull.pull_run` runs with ``take=True``.

1. (pull) download and verify the run as it is; 2. create the epoch+1 lease
(:func:`create_take_lease`); 3. list the old epoch again (:func:`settled_snapshot`),
download and verify what it gained; 4. record the bases taken over in the new epoch's
create-only bases object (:func:`record_bases`). Before step 2,
:func:`refuse_live_owner` refuses to fence an owner that still renews its lease with
the background mirror. docs/remote.md tells why the order matters.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from afk_local.errors import MirrorError, RemoteIntegrityError, RunNotFoundError
from afk_local.integrations.remote.bucket import Bucket
from afk_local.integrations.remote.lease import (
    TIMESTAMP_RESOLUTION_MS,
    Bases,
    Lease,
    Renewal,
    create_bases,
    create_lease,
    last_renewal,
    lease_lost,
    read_leases,
    safety_margin_ms,
)
from afk_local.integrations.remote.remote_run import RemoteRun, Snapshot, read_remote_run
from afk_local.storage.format.integrity import Signer

log = logging.getLogger("afk_local")


@dataclass(frozen=True)
class OwnerCheck:
    """What :func:`refuse_live_owner` found out about the holder."""

    renewed_ms: int | None
    """How long ago it renewed (None: never)."""
    forced: bool = False
    """True when only ``force`` let the take go on: say so once the take succeeded."""


def lapse_ms(renewal: Renewal) -> int:
    """How old a renewal must look by its server timestamp before its lease counts as
    lapsed: the period, plus the safety margin the holder fences itself by, plus the
    remote's timestamp resolution (a fresh S3 renewal may look a second old)."""
    return renewal.lease_ms + safety_margin_ms(renewal.lease_ms) + TIMESTAMP_RESOLUTION_MS


def holder_renewal(
    bucket: Bucket, run_id: str, signer: Signer | None
) -> tuple[int, tuple[Renewal, int] | None]:
    """The head epoch and its holder's renewal, read BEFORE the run is listed: what the
    renewal pins was on the remote before that listing began."""
    leases = read_leases(bucket, run_id, signer)
    if not leases:
        raise RunNotFoundError(run_id, bucket.url)
    epoch = max(leases)
    return epoch, last_renewal(bucket, run_id, epoch, signer)


def refuse_live_owner(
    remote: RemoteRun,
    snapshot: Snapshot,
    renewed: tuple[int, tuple[Renewal, int] | None],
    force: bool,
) -> OwnerCheck:
    """Before step 2: how long ago the holder renewed (``renewed``, from
    :func:`holder_renewal`); MirrorError if it still renews with the background mirror
    (its effects are not fenced one by one) and not ``force``.

    The renewal pins what the holder had confirmed on the remote: a remote that holds
    less was rolled back (RemoteIntegrityError, whatever ``force``); a release counts
    only while the remote holds exactly what the releasing session left (else it is an
    old session's, replayed, and the holder may be alive)."""
    bucket, head = remote.bucket, remote.head
    epoch, found = renewed
    if found is None:
        return OwnerCheck(None)
    renewal, age_ms = found
    if epoch != head.epoch:  # the lease moved meanwhile: creating ours fails anyway
        return OwnerCheck(age_ms)
    check_pins(bucket.url, renewal, snapshot, "refused, nothing was published")
    released = renewal.released and (
        renewal.journal_end,
        renewal.head_seq,
        renewal.meta_version,
    ) == (snapshot.journal_end, snapshot.head_seq, max(remote.objects(head.epoch).metas, default=0))
    live = not (renewal.sync_effects or released) and age_ms < lapse_ms(renewal)
    if not live or force:
        return OwnerCheck(age_ms, forced=live)
    raise MirrorError(
        bucket.url,
        f"run {head.run_id}: store {head.owner[:12]} (host {head.host or '?'}) renewed its lease "
        f"{age_ms / 1000:.1f} s ago and mirrors effects in the background: taking it now could "
        f"run effects twice; wait until its lease lapses ({lapse_ms(renewal) / 1000:g} s without "
        "renewal) or pass --force",
    )


def check_pins(url: str, renewal: Renewal, snapshot: Snapshot, outcome: str) -> None:
    """RemoteIntegrityError when ``snapshot`` (listed after ``renewal`` was read) holds
    less than the renewal says its holder confirmed: objects were deleted."""
    if renewal.journal_end > snapshot.journal_end or renewal.head_seq > snapshot.head_seq:
        raise RemoteIntegrityError(
            url,
            f"run {snapshot.run_id}: its holder confirmed the journal up to byte "
            f"{renewal.journal_end} and seq {renewal.head_seq}, but the remote holds "
            f"{snapshot.journal_end} and {snapshot.head_seq}: objects were deleted or rolled "
            f"back; {outcome}",
        )


def recheck_pins(bucket: Bucket, found: tuple[Renewal, int] | None, snapshot: Snapshot) -> None:
    """Step 3: the old holder's renewal, read again between steps 2 and 3 (it may have
    pinned an intent it uploaded after step 1), against the listing of step 3. Read
    after our lease exists, a later pin belongs to an intent whose effect the holder's
    check then refuses; read before the listing, every pin it holds must be listed."""
    if found is not None:
        check_pins(
            bucket.url,
            found[0],
            snapshot,
            "the take stops here and nothing was published locally; the old holder is "
            "fenced (restore the deleted objects before taking the run again)",
        )


def warn_forced(head: Lease, check: OwnerCheck) -> None:
    """After a take that only ``force`` allowed: what may run twice."""
    if check.forced:
        log.warning(
            "run %s: taken with --force from store %s, which renewed its lease %.1f s ago: "
            "effects it starts before it sees the new lease may run twice",
            head.run_id,
            head.owner[:12],
            (check.renewed_ms or 0) / 1000,
        )


def settled_snapshot(bucket: Bucket, run_id: str, signer: Signer | None, owner: str) -> Snapshot:
    """Step 3: the old epochs as listed now, after this store's lease exists."""
    remote = read_remote_run(bucket, run_id, signer)
    if remote is None or remote.head.owner != owner:
        holder = remote.head if remote is not None else None
        if holder is None:
            raise RunNotFoundError(run_id, bucket.url)
        raise lease_lost(bucket, run_id, holder, None)
    return remote.snapshot()


def record_bases(bucket: Bucket, bases: Bases, signer: Signer | None) -> None:
    """Step 4: record what the take took over (create-only; an earlier attempt's must match)."""
    if create_bases(bucket, bases, signer):
        return
    # Made by an earlier attempt of this store that died before publishing: it must
    # say the same, else the remote would describe another history than this copy.
    current = read_leases(bucket, bases.run_id, signer).get(bases.epoch)
    if current is None or (current.base_seq, current.journal_base) != (
        bases.base_seq,
        bases.journal_base,
    ):
        raise RemoteIntegrityError(
            bucket.url,
            f"run {bases.run_id}: epoch {bases.epoch} already records other bases: refused",
        )


def create_take_lease(bucket: Bucket, lease: Lease, signer: Signer | None) -> None:
    """Step 2: create the new epoch's lease; LeaseLostError if another store took it first."""
    if not create_lease(bucket, lease, signer):
        remote = read_remote_run(bucket, lease.run_id, signer)
        holder = remote.head if remote is not None else lease
        raise lease_lost(bucket, lease.run_id, holder, None)
    log.info("run %s: lease epoch %d taken on %s", lease.run_id, lease.epoch, bucket.url)


__all__ = [
    "OwnerCheck",
    "check_pins",
    "create_take_lease",
    "holder_renewal",
    "lapse_ms",
    "recheck_pins",
    "record_bases",
    "refuse_live_owner",
    "settled_snapshot",
    "warn_forced",
]
