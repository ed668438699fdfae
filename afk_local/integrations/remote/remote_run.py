"""What a remote holds of one run, and which of its objects make up the run.

:func:`read_remote_run` lists a run's objects once and sorts them by epoch.
:meth:`RemoteRun.snapshot` picks the objects a pull takes: for each epoch, the
files whose seq lies between that epoch's base and the next epoch's base, and the
journal segments from that epoch's journal base up to the next one's; ``run.meta``
is the newest version of the newest epoch (or the one its lease took over). What
an old owner uploaded after its lease moved lies past the next base and is left out.
An epoch whose take has not finished (no bases yet) holds nothing and is skipped; an
epoch that holds objects (a renewal, data) but lacks its lease or bases object had one
deleted, and the run is refused (:func:`read_remote_run`).

The ``run.meta`` versions are listed BEFORE the files and segments: an owner uploads
a meta only after the files it describes, so whatever meta the first listing saw,
the second sees its files (a single listing is paged, and a page of checkpoints
served before the meta's page could miss a file uploaded just before that meta).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from afk_local.errors import MirrorError, RemoteIntegrityError
from afk_local.integrations.remote.bucket import Bucket
from afk_local.integrations.remote.layout import (
    MAX_RUN_OBJECTS,
    epoch_dir,
    file_key,
    meta_key,
    parse_run_key,
    segment_key,
)
from afk_local.integrations.remote.lease import Lease, read_leases
from afk_local.storage.format.integrity import Signer


@dataclass
class EpochObjects:
    """The data objects one epoch's owner uploaded."""

    files: dict[str, tuple[int, int]] = field(default_factory=dict)
    """File name -> (seq, size)."""
    segments: dict[int, int] = field(default_factory=dict)
    """Journal segment offset -> size."""
    metas: dict[int, int] = field(default_factory=dict)
    """run.meta version -> size."""

    def journal_end(self, start: int) -> int:
        """Where the contiguous run of segments from ``start`` ends (``start`` if none)."""
        end = start
        while end in self.segments:
            end += self.segments[end]
        return end


@dataclass(frozen=True)
class RemoteFile:
    """One object a pull downloads."""

    key: str
    name: str
    seq: int
    size: int


@dataclass(frozen=True)
class Segment:
    """One journal segment a pull downloads."""

    key: str
    offset: int
    size: int


@dataclass(frozen=True)
class Snapshot:
    """The run as a pull takes it: files, journal segments, meta."""

    run_id: str
    files: list[RemoteFile]
    segments: list[Segment]
    journal_end: int
    head_seq: int
    meta_key: str | None
    """The key of the newest run.meta, or None when the head lease's copy is the newest."""
    lease_meta: bytes | None


@dataclass
class RemoteRun:
    """A run's leases and objects as listed at one moment."""

    bucket: Bucket
    run_id: str
    leases: dict[int, Lease]
    epochs: dict[int, EpochObjects]

    @property
    def head(self) -> Lease:
        """The newest lease: its owner may write the run."""
        return self.leases[max(self.leases)]

    def objects(self, epoch: int) -> EpochObjects:
        """The objects uploaded in ``epoch`` (empty if none)."""
        return self.epochs.get(epoch) or EpochObjects()

    def snapshot(self) -> Snapshot:
        """The objects that make up the run now (see the module docstring).

        Raises:
            MirrorError: an older epoch's journal segments do not reach the next base,
                or there is no run.meta at all.
        """
        settled = [e for e in sorted(self.leases) if self.leases[e].settled]
        files: list[RemoteFile] = []
        segments: list[Segment] = []
        offset = 0
        for index, epoch in enumerate(settled):
            lease = self.leases[epoch]
            upper = self.leases[settled[index + 1]] if index + 1 < len(settled) else None
            objects = self.objects(epoch)
            for name, (seq, size) in objects.files.items():
                if seq == 0 or (seq > lease.base_seq and (upper is None or seq <= upper.base_seq)):
                    files.append(RemoteFile(file_key(self.run_id, epoch, name), name, seq, size))
            offset = lease.journal_base
            stop = upper.journal_base if upper is not None else None
            while offset in objects.segments and (stop is None or offset < stop):
                size = objects.segments[offset]
                segments.append(Segment(segment_key(self.run_id, epoch, offset), offset, size))
                offset += size
            if stop is not None and offset != stop:
                raise RemoteIntegrityError(
                    self.bucket.url,
                    f"run {self.run_id}: epoch {epoch}'s journal segments end at byte {offset}, "
                    f"but the next epoch took over at byte {stop}: the remote is damaged",
                )
            if stop is None and any(o > offset for o in objects.segments):
                raise RemoteIntegrityError(
                    self.bucket.url,
                    f"run {self.run_id}: epoch {epoch}'s journal has a gap at byte {offset} "
                    "(a segment is missing): the remote is damaged, refused",
                )
        files.sort(key=lambda f: (f.seq, f.name))
        last = self.leases[settled[-1]]
        head_seq = max((f.seq for f in files), default=0)
        head_seq = max(head_seq, last.base_seq)
        metas = self.objects(last.epoch).metas
        key = meta_key(self.run_id, last.epoch, max(metas)) if metas else None
        if key is None and last.meta is None:
            raise MirrorError(
                self.bucket.url,
                f"run {self.run_id}: no run.meta uploaded yet (its first writer has not "
                "synced it); push the run again",
            )
        return Snapshot(
            run_id=self.run_id,
            files=files,
            segments=segments,
            journal_end=offset,
            head_seq=head_seq,
            meta_key=key,
            lease_meta=last.meta,
        )


def read_remote_run(bucket: Bucket, run_id: str, signer: Signer | None = None) -> RemoteRun | None:
    """List the run's leases and objects; None when the remote has no lease for it.

    Objects under the run that are not ours (other names, bad epochs) are ignored.
    With ``signer`` (a keyed store), unsigned lease and bases objects are refused.

    Raises:
        RemoteIntegrityError: an epoch holds objects but its lease or bases object is gone.
    """
    leases = read_leases(bucket, run_id, signer)
    if not leases:
        return None
    epochs: dict[int, EpochObjects] = {}
    prefix = len(run_id) + 1
    last = max(leases)
    # Metas first (see the module docstring), and only the newest settled epoch's
    # matter: a snapshot takes its newest meta, an uploader appends versions to it.
    newest = max(e for e, lease in leases.items() if lease.settled)
    metas = epochs.setdefault(newest, EpochObjects()).metas
    for listed in bucket.list_objects(f"{epoch_dir(run_id, newest)}/meta", limit=MAX_RUN_OBJECTS):
        parsed = parse_run_key(listed.key[prefix:])
        if parsed is not None and parsed.kind == "meta" and parsed.epoch == newest:
            metas[parsed.number] = listed.size
    used: set[int] = set()  # epochs with a renewal or data: their takes finished
    for listed in bucket.list_objects(run_id, limit=MAX_RUN_OBJECTS):
        parsed = parse_run_key(listed.key[prefix:])
        if parsed is None or parsed.kind in ("lease", "bases"):
            continue
        used.add(parsed.epoch)
        if parsed.kind in ("alive", "meta") or parsed.epoch > last:
            continue
        objects = epochs.setdefault(parsed.epoch, EpochObjects())
        if parsed.kind == "file":
            objects.files[parsed.name] = (parsed.number, listed.size)
        elif parsed.kind == "segment" and listed.size > 0:
            objects.segments[parsed.number] = listed.size
    _check_chain(bucket, run_id, leases, used)
    return RemoteRun(bucket, run_id, leases, epochs)


def _check_chain(bucket: Bucket, run_id: str, leases: dict[int, Lease], used: set[int]) -> None:
    """Lease history is append-only: an epoch that holds objects had its lease and, once
    taken, its bases. A missing one was deleted, and skipping it would drop that epoch's
    work (or hand its number to a second owner): refused, for takers and holders alike."""
    for epoch in sorted(used):
        lease = leases.get(epoch)
        if lease is None:
            missing = f"{epoch:012d}.lease"
        elif not lease.settled:
            missing = f"{epoch:012d}.bases"
        else:
            continue
        raise RemoteIntegrityError(
            bucket.url,
            f"run {run_id}: epoch {epoch} holds objects but lease/{missing} is gone: the lease "
            "chain is broken (the remote was damaged or tampered with): refused",
        )


__all__ = [
    "EpochObjects",
    "RemoteFile",
    "RemoteRun",
    "Segment",
    "Snapshot",
    "read_remote_run",
]
