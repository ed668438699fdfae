"""The steps of the take protocol that :func:`~.pull.pull_run` runs with ``take=True``.

1. (pull) download and verify the run as it is; 2. create the epoch+1 lease
(:func:`create_take_lease`); 3. list the old epoch again (:func:`settled_remote`),
download and verify what it gained; 4. record the bases taken over in the new epoch's
create-only bases object (:func:`record_bases`). Before step 2,
:func:`refuse_live_owner` refuses to fence an owner that still renews its lease with
the background mirror. docs/remote.md tells why the order matters.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from afk_local.errors import MirrorError, RemoteIntegrityError, RunNotFoundError
from afk_local.integrations.remote.bucket import Bucket
from afk_local.integrations.remote.lease import (
    MAX_REVIVAL_WAITS,
    REVIVAL_WAIT_S,
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
    released = release_holds(renewal, snapshot, remote.objects(head.epoch).metas)
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


@dataclass(frozen=True)
class Reread:
    """The holder's renewal as read right before step 2, and when (monotonic)."""

    renewal: Renewal | None
    read_at: float


def reread_renewal(
    bucket: Bucket,
    run_id: str,
    epoch: int,
    renewed: tuple[Renewal, int] | None,
    check: OwnerCheck,
    *,
    signer: Signer | None,
) -> Reread | None:
    """Right before step 2, for a take that goes on because a background holder's lease
    lapsed, was released or was never renewed: read the renewal again (the pull took a
    while). MirrorError (nothing published) if it changed and is recent: the holder
    revived meanwhile. None when nothing needs re-reading (a ``sync_effects`` holder's
    effects are fenced one by one; a forced take was warned)."""
    if check.forced or (renewed is not None and renewed[0].sync_effects):
        return None
    read_at = time.monotonic()
    found = last_renewal(bucket, run_id, epoch, signer)
    renewal = found[0] if found is not None else None
    if renewal != (renewed[0] if renewed is not None else None) and (
        found is not None and found[1] < lapse_ms(found[0])
    ):
        raise MirrorError(
            bucket.url,
            f"run {run_id}: its holder renewed its lease {found[1] / 1000:.1f} s ago, while "
            "this take was under way (it is alive again): refused, nothing was published; "
            f"wait until its lease lapses ({lapse_ms(found[0]) / 1000:g} s without renewal)",
        )
    return Reread(renewal, read_at)


def holder_may_live(
    reread: Reread | None,
    pinned: tuple[Renewal, int] | None,
    remote: RemoteRun,
    snapshot: Snapshot,
    epoch: int,
) -> bool:
    """Step 3, after the listing: True when the holder (background, not forced) may have
    started effects that are not on the remote yet although the take went on:

    - its renewal (``pinned``, read after the create) changed since the re-read and the
      create ended :data:`REVIVAL_WAIT_S` or more after that re-read (a revival whose
      confirming check may have come before the create);
    - its renewal is a release that the listing no longer matches (a later session wrote
      since: the release was an earlier session's, put back).

    The holder sees the new epoch at its next renewal, uploads its journal's tail to its
    own epoch and stops renewing: :func:`wait_for_lapse`, then list again."""
    if reread is None or pinned is None:
        return False
    renewal = pinned[0]
    revived = renewal != reread.renewal and time.monotonic() - reread.read_at >= REVIVAL_WAIT_S
    replayed = renewal.released and not release_holds(
        renewal, snapshot, remote.objects(epoch).metas
    )
    return revived or replayed


def wait_for_lapse(
    bucket: Bucket,
    run_id: str,
    epoch: int,
    pinned: tuple[Renewal, int] | None,
    *,
    signer: Signer | None,
) -> tuple[Renewal, int] | None:
    """Wait until the holder's renewal of ``epoch`` lapsed (it saw the new lease and
    stopped); returns the renewal as last read.

    Raises:
        MirrorError: it still renewed after :data:`MAX_REVIVAL_WAITS` lapse periods (the
            take stops before its listing; ``pull --take`` again finishes it).
    """
    log.warning(
        "run %s: its holder may have been alive while this take created its lease: waiting "
        "for it to see the new lease and stop before listing the run again",
        run_id,
    )
    found = pinned
    deadline = time.monotonic() + (
        MAX_REVIVAL_WAITS * lapse_ms(pinned[0]) / 1000 if pinned is not None else 0
    )
    while found is not None and found[1] < lapse_ms(found[0]):  # a release too: put back?
        if time.monotonic() >= deadline:
            raise MirrorError(
                bucket.url,
                f"run {run_id}: its holder still renews its lease after this take created its "
                "own: the take stops before listing, nothing was published locally; "
                "`pull --take` again finishes it once the holder stopped",
            )
        time.sleep(min(1.0, (lapse_ms(found[0]) - found[1]) / 1000))
        found = last_renewal(bucket, run_id, epoch, signer)
    return found


def release_holds(renewal: Renewal, snapshot: Snapshot, metas: dict[int, int]) -> bool:
    """True when ``renewal`` is a release and the remote holds exactly what the releasing
    session left (journal length, newest seq, the newest of ``metas``, its epoch's meta
    versions): a release an earlier session wrote, put back later, no longer matches once
    a later session uploaded its meta."""
    return renewal.released and (
        renewal.journal_end,
        renewal.head_seq,
        renewal.meta_version,
    ) == (snapshot.journal_end, snapshot.head_seq, max(metas, default=0))


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


def settled_remote(bucket: Bucket, run_id: str, signer: Signer | None, owner: str) -> RemoteRun:
    """Step 3: the old epochs as listed now, after this store's lease exists."""
    remote = read_remote_run(bucket, run_id, signer)
    if remote is None or remote.head.owner != owner:
        holder = remote.head if remote is not None else None
        if holder is None:
            raise RunNotFoundError(run_id, bucket.url)
        raise lease_lost(bucket, run_id, holder, None)
    return remote


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
    "Reread",
    "check_pins",
    "create_take_lease",
    "holder_may_live",
    "holder_renewal",
    "lapse_ms",
    "recheck_pins",
    "record_bases",
    "refuse_live_owner",
    "release_holds",
    "reread_renewal",
    "settled_remote",
    "wait_for_lapse",
    "warn_forced",
]
