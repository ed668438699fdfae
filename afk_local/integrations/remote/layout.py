"""Object keys of a mirrored run, and the checks that keep a bucket's names in bounds.

Under the mirror's prefix (``s3://bucket/prefix``), one run is::

    <run_id>/lease/<epoch:012d>.lease               who may write the run (create-only, JSON)
    <run_id>/lease/<epoch:012d>.bases               where a taken epoch starts (create-only)
    <run_id>/lease/<epoch:012d>.alive               the holder's renewal (replaced; for takers)
    <run_id>/e<epoch:012d>/<file name>              an immutable run file, by its local name:
                                                    <seq:012d>.<phase>.ckpt, or a *.pack
    <run_id>/e<epoch:012d>/effects/<offset:016d>.seg    effects.log bytes from that offset
    <run_id>/e<epoch:012d>/meta/<version:012d>.meta     run.meta as of that version

Every data object lives under the epoch of the lease its writer held, so an upload
that was in flight when the lease moved can never take a name the new holder needs.
A bucket is data someone else wrote: every key read back is parsed here and anything
that does not match exactly is ignored, and every size has a bound.

Example:
    >>> lease_key("run-1", 2)
    'run-1/lease/000000000002.lease'
    >>> parse_run_key("e000000000002/000000000007.runtime_state.ckpt")
    RunObject(kind='file', epoch=2, number=7, name='000000000007.runtime_state.ckpt')
"""

from __future__ import annotations

import re
from typing import Literal, NamedTuple

from afk_local.storage.format.layout import parse_checkpoint_name, parse_pack_name
from afk_local.storage.format.pack import MAX_PACK_BYTES

MAX_EPOCH = 10**12 - 1
MAX_LEASE_BYTES = 4 << 20
"""A lease holds the run.meta it took over: bounded like a meta."""
MAX_META_BYTES = 4 << 20
MAX_SEGMENT_BYTES = 64 << 20
"""The largest journal segment read back (writers cut segments at 16 MiB)."""
SEGMENT_CUT_BYTES = 16 << 20
MAX_RUN_OBJECTS = 2_000_000
"""Objects listed for one run before the listing is refused as absurd."""
MAX_RUNS = 1_000_000

PACK_SUFFIX = ".pack"
"""Immutable run files other than checkpoints that the mirror carries by name (packs)."""

_LEASE = re.compile(r"lease/([0-9]{12})\.(lease|bases|alive)")
_EPOCH_FILE = re.compile(r"e([0-9]{12})/([A-Za-z0-9][A-Za-z0-9._-]{0,127})")
_SEGMENT = re.compile(r"e([0-9]{12})/effects/([0-9]{16})\.seg")
_META = re.compile(r"e([0-9]{12})/meta/([0-9]{12})\.meta")

ObjectKind = Literal["lease", "bases", "alive", "file", "segment", "meta"]


class RunObject(NamedTuple):
    """One parsed object key of a run (relative to ``<prefix>/<run_id>/``).

    ``number`` is the epoch for a lease, the seq for a checkpoint (a pack's last
    seq), the byte offset for a segment, the version for a meta.
    """

    kind: ObjectKind
    epoch: int
    number: int
    name: str


def epoch_dir(run_id: str, epoch: int) -> str:
    """``<run_id>/e<epoch>``: where the holder of ``epoch`` puts its objects."""
    return f"{run_id}/e{epoch:012d}"


def lease_dir(run_id: str) -> str:
    """``<run_id>/lease``."""
    return f"{run_id}/lease"


def lease_key(run_id: str, epoch: int) -> str:
    """The key of the lease object of ``epoch``."""
    return f"{run_id}/lease/{epoch:012d}.lease"


def bases_key(run_id: str, epoch: int) -> str:
    """The key of the bases object of ``epoch`` (what its taker took over)."""
    return f"{run_id}/lease/{epoch:012d}.bases"


def alive_key(run_id: str, epoch: int) -> str:
    """The key of the renewal object the holder of ``epoch`` replaces while it runs."""
    return f"{run_id}/lease/{epoch:012d}.alive"


def file_key(run_id: str, epoch: int, name: str) -> str:
    """The key of an immutable run file uploaded in ``epoch``."""
    return f"{epoch_dir(run_id, epoch)}/{name}"


def segment_key(run_id: str, epoch: int, offset: int) -> str:
    """The key of the journal segment that starts at byte ``offset``."""
    return f"{epoch_dir(run_id, epoch)}/effects/{offset:016d}.seg"


def meta_key(run_id: str, epoch: int, version: int) -> str:
    """The key of ``run.meta`` version ``version``."""
    return f"{epoch_dir(run_id, epoch)}/meta/{version:012d}.meta"


def file_seq(name: str) -> int | None:
    """The seq a mirrored file belongs to: a checkpoint's seq, a pack's last seq.

    None for names the mirror does not carry (``pack-<first>-<last>-<digest>.pack``
    is the only pack name a store writes).
    """
    parsed = parse_checkpoint_name(name)
    if parsed is not None:
        return parsed.seq
    pack = parse_pack_name(name)
    return None if pack is None else pack.last


def is_mirrored_file(name: str) -> bool:
    """True for the immutable run files the mirror carries (checkpoints, packs)."""
    return file_seq(name) is not None


def parse_run_key(relative: str) -> RunObject | None:
    """Parse a key relative to ``<run_id>/``; None for anything that is not ours."""
    match = _LEASE.fullmatch(relative)
    if match:
        epoch, kind = int(match.group(1)), match.group(2)
        if not 0 < epoch <= MAX_EPOCH:
            return None
        if kind == "bases":
            return RunObject("bases", epoch, epoch, relative)
        if kind == "alive":
            return RunObject("alive", epoch, epoch, relative)
        return RunObject("lease", epoch, epoch, relative)
    match = _SEGMENT.fullmatch(relative)
    if match:
        epoch = int(match.group(1))
        return RunObject("segment", epoch, int(match.group(2)), relative) if epoch else None
    match = _META.fullmatch(relative)
    if match:
        epoch, version = int(match.group(1)), int(match.group(2))
        return RunObject("meta", epoch, version, relative) if epoch and version else None
    match = _EPOCH_FILE.fullmatch(relative)
    if match:
        epoch, name = int(match.group(1)), match.group(2)
        seq = file_seq(name)
        if epoch and seq is not None:
            return RunObject("file", epoch, seq, name)
    return None


def max_file_bytes(name: str, max_record_bytes: int) -> int:
    """The largest object accepted for a mirrored file: a checkpoint's frame, or a pack."""
    if name.endswith(PACK_SUFFIX):
        return MAX_PACK_BYTES
    # A frame: 26 header bytes, a zstd body no larger than its content plus framing, a MAC.
    return max_record_bytes + max_record_bytes // 64 + (1 << 16)


__all__ = [
    "MAX_EPOCH",
    "MAX_LEASE_BYTES",
    "MAX_META_BYTES",
    "MAX_RUNS",
    "MAX_RUN_OBJECTS",
    "MAX_SEGMENT_BYTES",
    "PACK_SUFFIX",
    "SEGMENT_CUT_BYTES",
    "RunObject",
    "alive_key",
    "bases_key",
    "epoch_dir",
    "file_key",
    "file_seq",
    "is_mirrored_file",
    "lease_dir",
    "lease_key",
    "max_file_bytes",
    "meta_key",
    "parse_run_key",
    "segment_key",
]
