"""Packing a run: folding its older loose checkpoint files into pack files, crash-safely.

:func:`pack_run` takes the loose checkpoint files of a run (all but the newest few,
the newest seq and ``latest``'s target always staying loose), writes them into a new
pack (:mod:`afk_local.storage.format.pack`) and removes them. Packs are merged as they
accumulate, git-style *geometrically*: a new pack absorbs the newer packs that are
not at least twice its size, so a run of n checkpoints keeps O(log n) packs and
each checkpoint is rewritten O(log n) times; ``full=True`` merges everything.

Crash safety (:mod:`~afk_local.storage.rundir.rewrite`): the new packs are made durable,
then the run's ``MANIFEST`` naming them and the new loose range is published, and only
then are the files it no longer names removed. A crash at any point leaves one manifest
in force with every file it names durable; what it does not name is garbage the next
rewrite removes. Packed checkpoints never depend on live loose ones: packs take a
prefix of the live loose files, and a delta's base has a lower seq.

The caller holds the run's lock
(:class:`~afk_local.storage.rundir.write.writer.RunWriter` packs as it writes;
:meth:`afk_local.Store.pack` takes the lock of an idle run).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from afk_local.errors import AfkLocalError, CheckpointCorruptionError
from afk_local.storage import fsio
from afk_local.storage.format import codec
from afk_local.storage.format.codec import RecordCodec
from afk_local.storage.format.layout import (
    DEFAULT_LOOSE_LIMIT,
    CheckpointFile,
    PackFile,
    RunPaths,
    parse_checkpoint_name,
)
from afk_local.storage.format.manifest import Manifest
from afk_local.storage.format.pack import (
    MAX_ENTRY_BYTES,
    MAX_PACK_INPUT_BYTES,
    PackEntry,
    read_block,
)
from afk_local.storage.rundir.read.catalog import RunCatalog
from afk_local.storage.rundir.read.chain import is_signed_file
from afk_local.storage.rundir.rewrite import (
    chunks,
    garbage,
    publish_manifest,
    remove_garbage,
    write_packs,
)

log = logging.getLogger("afk_local")


@dataclass
class PackReport:
    """What :func:`pack_run` did (or, in a dry run, would do) to one run."""

    run_id: str
    packed_files: int = 0
    """Loose checkpoint files folded into a pack (and removed)."""
    packs_written: int = 0
    packs_merged: int = 0
    """Older packs merged into the new one (and removed)."""
    duplicates_removed: int = 0
    """Files an interrupted rewrite left that no manifest names (garbage), removed."""
    loose_left: int = 0
    files_before: int = 0
    files_after: int = 0
    bytes_before: int = 0
    """Sizes of the run's checkpoint and pack files before."""
    bytes_after: int = 0
    skipped: str = ""
    """Why the run was left alone (its owner is alive), empty when it was not."""
    errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary."""
        return dict(vars(self))


def pack_run(
    paths: RunPaths,
    record_codec: RecordCodec,
    *,
    keep_loose: int = 1,
    keep_from: int | None = None,
    full: bool = False,
    merge: bool = True,
    sync_removals: bool = True,
    dry_run: bool = False,
    measure: bool = True,
    images: Mapping[str, bytes] | None = None,
    env: fsio.Env = fsio.DEFAULT_ENV,
) -> PackReport:
    """Fold the older loose checkpoint files of one run into a pack. The caller holds its lock.

    Args:
        paths: the run.
        record_codec: the store's codec (its key signs the pack and the manifest).
        keep_loose: the newest loose files that stay loose (at least one: the newest
            seq, and ``latest``'s target, always do).
        keep_from: loose files from this seq on stay loose too (a writer keeps the
            delta chains it is still extending).
        full: merge every pack (and the new files) into as few packs as the size
            bounds allow; otherwise only the newer, smaller packs are merged.
        merge: False: add a pack and leave the existing ones alone (a run written
            before manifests existed is still merged once, to adopt it).
        sync_removals: fsync the directory after removing the superseded files (a
            writer leaves that to its next checkpoint's directory fsync).
        dry_run: say what would happen, change nothing.
        measure: False leaves the report's counts of files and bytes before and after
            at 0 (``loose_left`` stays exact), sparing a listing and a stat of every file
            before and after (a writer's own packing, which reports none of them).
        images: the exact bytes of loose files, by name, that the caller wrote itself
            under the lock it still holds (a writer's own checkpoints): packed as they
            are, without reading them back. Any other loose file is read from disk.
        env: the I/O seam to write through (the store's).

    Raises:
        AfkLocalError: the run is signed and the codec has no key (it could not sign
            the pack); nothing changed.
        OSError: a write failed; every checkpoint is still readable.
    """
    report = PackReport(paths.run_id)
    if record_codec.signer is None and is_signed_file(paths.meta):
        raise AfkLocalError(
            f"run {paths.run_id!r}: not packed: its files are signed and this store has no "
            "key to sign a pack with; pack it with AFK_LOCAL_KEY set"
        )
    if not dry_run:
        _remove_temp_files(paths, env)
    catalog = RunCatalog(paths, signer=record_codec.signer)
    if measure or dry_run:
        all_loose, all_packs = catalog.scan()
        report.files_before = len(all_loose) + len(all_packs)
        report.bytes_before = _sizes(
            paths, [f.name for f in all_loose] + [p.name for p in all_packs]
        )
    try:
        view = live_view(catalog)
        plan = _plan(
            paths,
            catalog,
            view,
            keep_loose=keep_loose,
            keep_from=keep_from,
            full=full,
            merge=merge,
            images=images or {},
        )
    except CheckpointCorruptionError as exc:
        report.errors.append(f"run {paths.run_id}: not packed: {exc}")
        report.loose_left = len(catalog.scan()[0])
        return report
    report.packed_files = len(plan.loose)
    report.packs_merged = len(plan.merge)
    # What the lock holder listed: only it changes the directory, by adding the new
    # packs and manifest, which are live (one listing serves the whole rewrite).
    listing = catalog.scanned
    stale = garbage(paths, view.manifest, listing) if view.manifest is not None else []
    report.duplicates_removed = len(stale)
    if dry_run or not (plan.loose or plan.merge or stale):
        report.loose_left = len(view.loose) - len(plan.loose)
        new_packs = len(chunks(list(plan.entries)))
        report.files_after = report.files_before - len(stale) - len(plan.merge) + new_packs
        report.files_after -= len(plan.loose)
        report.bytes_after = report.bytes_before  # not known before the packs are made
        return report
    manifest = view.manifest
    if plan.loose or plan.merge:
        written = write_packs(paths, plan.entries, record_codec.signer, env)
        report.packs_written = len(written)
        merged = {p.name for p in plan.merge}
        kept = [p.name for p in view.packs if p.name not in merged]
        manifest = publish_manifest(
            paths,
            view.manifest,
            kept + written,
            plan.loose_from,
            signer=record_codec.signer,
            env=env,
        )
    assert manifest is not None
    # Everything below is garbage now: the new manifest is durable.
    removed = remove_garbage(
        paths,
        manifest,
        env,
        just_published=manifest is not view.manifest,
        sync=sync_removals,
        listing=listing,
    )
    report.duplicates_removed = max(0, removed - len(plan.loose) - len(plan.merge))
    if measure:
        loose_after, packs_after = catalog.scan()
        report.loose_left = len(loose_after)
        report.files_after = len(loose_after) + len(packs_after)
        report.bytes_after = _sizes(
            paths, [f.name for f in loose_after] + [p.name for p in packs_after]
        )
    else:  # what is left loose: the live loose files the new manifest keeps
        report.loose_left = sum(1 for f in view.loose if f.seq >= manifest.loose_from)
    log.info(
        "run %s: packed %d checkpoint file(s) into %d pack(s), merged %d pack(s)",
        paths.run_id,
        report.packed_files,
        report.packs_written,
        report.packs_merged,
    )
    return report


@dataclass(frozen=True)
class LiveView:
    """What a rewrite starts from: the run's live copies, through its manifest."""

    manifest: Manifest | None
    loose: list[CheckpointFile]
    """The live loose files."""
    packs: list[PackFile]
    """The live packs (every pack, in a run without a manifest)."""
    files: list[CheckpointFile] | None
    """Every live checkpoint, each seq once, where its live copy is; None in a run with a
    manifest, where nothing needs it (listing every packed checkpoint of a long run
    costs more than packing a few hundred new ones: :meth:`RunCatalog.files`)."""
    legacy: bool
    """Packs but no manifest (written before manifests existed, or a crash came before
    the first one): the next rewrite merges every pack to adopt the run."""
    loose_from: int
    """Seqs below this are packed: the manifest's, or one past the highest packed seq."""


def live_view(catalog: RunCatalog) -> LiveView:
    """The live copies of ``catalog``'s run, for a rewrite (the caller holds the lock).

    Raises:
        CheckpointCorruptionError: the manifest is damaged, or (a run without one) a
            pack is: the run is left alone, verify names the file.
    """
    loose, packs, manifest = catalog.live()
    if catalog.manifest_problem is not None:
        raise catalog.manifest_problem
    if manifest is not None:
        return LiveView(manifest, loose, packs, None, False, manifest.loose_from)
    files = catalog.files()
    for pack in packs:
        catalog.pack_reader(pack)  # every pack must open to be adopted
    loose_from = max((f.seq for f in files if f.pack is not None), default=0) + 1
    return LiveView(None, loose, packs, files, bool(packs), loose_from)


@dataclass(frozen=True)
class _Plan:
    loose: tuple[PackEntry, ...]
    """Loose files to pack, with their bytes."""
    merge: tuple[PackFile, ...]
    """Live packs the new pack(s) replace."""
    entries: tuple[PackEntry, ...]
    """Everything the new pack(s) hold, in seq order."""
    loose_from: int
    """The new manifest's loose_from."""


def _plan(
    paths: RunPaths,
    catalog: RunCatalog,
    view: LiveView,
    *,
    keep_loose: int,
    keep_from: int | None,
    full: bool,
    merge: bool,
    images: Mapping[str, bytes],
) -> _Plan:
    # The newest files stay loose: the newest seq (the writer continues after it) and
    # latest's target (a reader opens it first), plus keep_loose - 1 more.
    # The live loose files, each seq once (as a listing keeps them): a pack never holds a
    # live loose seq's copy, in a run with a manifest or without.
    candidates = sorted({f.seq: f for f in view.loose}.values())
    keep = {f.seq for f in candidates[-max(1, keep_loose) :]}
    target = fsio.read_link(paths.latest)
    latest = parse_checkpoint_name(target) if target else None
    if latest is not None:
        keep.add(latest.seq)
    chosen: list[PackEntry] = []
    total = 0
    prefix = str(paths.dir) + os.sep
    for file in candidates:
        # Only a prefix of the live loose files: every packed seq stays below every live
        # loose one (the manifest's loose_from), so a packed delta's base is packed too.
        stranded = file.seq < view.loose_from  # a run without a manifest: must go in
        if not stranded and (file.seq in keep or (keep_from is not None and file.seq >= keep_from)):
            break
        image = images.get(file.name)
        if image is None or len(image) > MAX_ENTRY_BYTES:
            image = _packable(prefix, file)
        if image is None:
            if stranded:
                raise CheckpointCorruptionError(
                    str(paths.dir / file.name), "cannot be packed, and a pack holds later seqs"
                )
            break
        chosen.append(PackEntry(file.seq, file.phase, image))
        total += len(image)
    merging: list[PackFile] = []
    if view.legacy:
        merging = list(view.packs)  # adopted: one manifest, every pack merged once
    elif merge:
        for pack in sorted(view.packs, key=lambda p: p.first, reverse=True):
            raw = _raw_size(catalog, pack)
            if not full and raw >= 2 * max(total, 1):
                break  # geometric: an older pack stays once it holds twice the newer bytes
            if total + raw > MAX_PACK_INPUT_BYTES:
                break
            merging.append(pack)
            total += raw
        if not chosen and len(merging) <= 1:
            merging = []  # nothing new, and nothing to merge with
    entries = {e.seq: e for e in _entries_of(catalog, view, merging)}
    entries.update({e.seq: e for e in chosen})  # a stranded loose copy is the live one
    loose_from = max(view.loose_from, chosen[-1].seq + 1 if chosen else 0)
    return _Plan(
        tuple(chosen), tuple(merging), tuple(entries[s] for s in sorted(entries)), loose_from
    )


def _raw_size(catalog: RunCatalog, pack: PackFile) -> int:
    """The checkpoint bytes a pack holds (what a new pack's loose bytes compare with)."""
    return sum(catalog.pack_reader(pack).index.lengths)


def _entries_of(catalog: RunCatalog, view: LiveView, packs: list[PackFile]) -> list[PackEntry]:
    """The live entries of ``packs`` (a seq whose live copy is elsewhere is skipped)."""
    names = {p.name for p in packs}
    # A manifest's packs never overlap and stay below its loose files (check_manifest):
    # every entry of a live pack is live, and only a run without one needs a listing.
    live = None if view.files is None else {f.seq for f in view.files if f.pack in names}
    entries: list[PackEntry] = []
    for pack in sorted(packs, key=lambda p: p.first):
        index = catalog.pack_reader(pack).index
        for block in index.blocks:
            raw = read_block(index.path, block)
            at = 0
            for entry in range(block.first_entry, block.first_entry + block.entry_count):
                length = index.lengths[entry]
                seq = index.seqs[entry]
                if live is None:
                    entries.append(PackEntry(seq, index.phase(entry), raw[at : at + length]))
                elif seq in live:
                    entries.append(PackEntry(seq, index.phase(entry), raw[at : at + length]))
                    live.discard(seq)  # overlapping packs a crash left: once
                at += length
    return entries


def _packable(prefix: str, file: CheckpointFile) -> bytes | None:
    """The bytes of a loose file that can go into a pack: a sound checkpoint frame,
    not too large. None otherwise (it stays loose, where verify names it)."""
    try:
        data = fsio.read_bounded(prefix + file.name, MAX_ENTRY_BYTES)
        codec.unpack_frame(data, file.name, expect_kind=codec.KIND_CHECKPOINT)
    except (OSError, ValueError, CheckpointCorruptionError):
        return None
    return data


def _remove_temp_files(paths: RunPaths, env: fsio.Env) -> None:
    """Remove what a killed writer or packer left unpublished (the caller holds the lock)."""
    with os.scandir(paths.dir) as entries:
        stray = [e.path for e in entries if e.name.startswith(fsio.TEMP_PREFIX) and e.is_file()]
    for path in stray:
        env.unlink(path)


def _size(paths: RunPaths, name: str) -> int:
    try:
        return os.lstat(paths.dir / name).st_size
    except OSError:
        return 0


def _sizes(paths: RunPaths, names: list[str]) -> int:
    total = 0
    for name in names:
        with contextlib.suppress(OSError):
            total += os.lstat(paths.dir / name).st_size
    return total


__all__ = ["DEFAULT_LOOSE_LIMIT", "LiveView", "PackReport", "live_view", "pack_run"]
