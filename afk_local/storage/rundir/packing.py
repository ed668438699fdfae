"""Packing a run: folding its older loose checkpoint files into pack files, crash-safely.

:func:`pack_run` takes the loose checkpoint files of a run (all but the newest few,
the newest seq and ``latest``'s target always staying loose), writes them into a new
pack (:mod:`afk_local.storage.format.pack`) and removes them. Packs are merged as they
accumulate, git-style *geometrically*: a new pack absorbs the newer packs that are
not at least twice its size, so a run of n checkpoints keeps O(log n) packs and
each checkpoint is rewritten O(log n) times; ``full=True`` merges everything.

Crash safety: a pack is published exactly like a checkpoint (temp file, fsync,
rename, directory fsync) *before* any file it supersedes is removed, and removing
only ever drops a second copy. A crash at any point leaves every checkpoint
readable, loose or packed or both (readers use either copy; the next pack removes
the leftovers). Packed checkpoints never depend on loose ones: a delta's base has a
lower seq, and packs take the oldest loose files first.

The caller holds the run's lock (:class:`~afk_local.storage.rundir.writer.RunWriter` packs as it
writes; :meth:`afk_local.Store.pack` takes the lock of an idle run).
"""

from __future__ import annotations

import contextlib
import logging
import os
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
    checkpoint_name,
    parse_checkpoint_name,
)
from afk_local.storage.format.pack import (
    MAX_ENTRY_BYTES,
    MAX_PACK_ENTRIES,
    MAX_PACK_INPUT_BYTES,
    PackEntry,
    encode_pack,
    read_block,
)
from afk_local.storage.rundir.catalog import RunCatalog
from afk_local.storage.rundir.chain import is_signed_file

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
    """Loose files a crash left next to the pack that already held them."""
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


@dataclass(frozen=True)
class _Plan:
    loose: tuple[PackEntry, ...]
    """Loose files to pack, with their bytes."""
    merge: tuple[PackFile, ...]
    """Existing packs to merge into the new pack(s)."""
    duplicates: tuple[CheckpointFile, ...]
    """Loose files a sound pack already holds, byte for byte."""


def pack_run(
    paths: RunPaths,
    record_codec: RecordCodec,
    *,
    keep_loose: int = 1,
    keep_from: int | None = None,
    full: bool = False,
    sync_removals: bool = True,
    dry_run: bool = False,
    env: fsio.Env = fsio.DEFAULT_ENV,
) -> PackReport:
    """Fold the older loose checkpoint files of one run into a pack. The caller holds its lock.

    Args:
        paths: the run.
        record_codec: the store's codec (its key signs the pack).
        keep_loose: the newest loose files that stay loose (at least one: the newest
            seq, and ``latest``'s target, always do).
        keep_from: loose files from this seq on stay loose too (a writer keeps the
            delta chains it is still extending).
        full: merge every pack (and the new files) into as few packs as the size
            bounds allow; otherwise only the newer, smaller packs are merged.
        sync_removals: fsync the directory after removing the superseded files (a
            writer leaves that to its next checkpoint's directory fsync).
        dry_run: say what would happen, change nothing.
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
    loose, packs = catalog.scan()
    report.files_before = len(loose) + len(packs)
    report.bytes_before = _sizes(paths, [f.name for f in loose] + [p.name for p in packs])
    plan = _plan(
        paths, catalog, loose, packs, keep_loose=keep_loose, keep_from=keep_from, full=full
    )
    report.packed_files = len(plan.loose)
    report.packs_merged = len(plan.merge)
    report.duplicates_removed = len(plan.duplicates)
    doomed_names = {checkpoint_name(e.seq, e.phase) for e in plan.loose}
    doomed_names |= {f.name for f in plan.duplicates}
    doomed_names |= {p.name for p in plan.merge}
    if dry_run or not doomed_names:
        report.loose_left = len(loose) - len(plan.loose) - len(plan.duplicates)
        new_packs = len(_chunks(list(plan.loose))) + bool(plan.merge and not plan.loose)
        report.files_after = report.files_before - len(doomed_names) + new_packs
        report.bytes_after = report.bytes_before  # not known before the packs are made
        return report
    written = (
        _write_packs(paths, record_codec, catalog, plan, env) if plan.loose or plan.merge else []
    )
    report.packs_written = len(written)
    # Everything below only drops second copies: the new packs are durable already. A
    # merge may produce a pack that exists (a crash came before its inputs were
    # removed): same name, same bytes; it is kept, of course.
    doomed_names -= set(written)
    report.packs_merged = sum(1 for p in plan.merge if p.name not in written)
    for name in sorted(doomed_names):
        env.unlink(paths.dir / name)
    if sync_removals:
        env.fsync_dir(paths.dir)
    loose_after, packs_after = catalog.scan()
    report.loose_left = len(loose_after)
    report.files_after = len(loose_after) + len(packs_after)
    report.bytes_after = _sizes(
        paths, [f.name for f in loose_after] + [p.name for p in packs_after]
    )
    log.info(
        "run %s: packed %d checkpoint file(s) into %d pack(s), merged %d pack(s)",
        paths.run_id,
        report.packed_files,
        report.packs_written,
        report.packs_merged,
    )
    return report


def _plan(
    paths: RunPaths,
    catalog: RunCatalog,
    loose: list[CheckpointFile],
    packs: list[PackFile],
    *,
    keep_loose: int,
    keep_from: int | None,
    full: bool,
) -> _Plan:
    packed: dict[int, PackFile] = {}
    sound: list[PackFile] = []
    for pack in packs:
        try:
            index = catalog.pack_reader(pack).index
        except (CheckpointCorruptionError, FileNotFoundError):
            continue  # a damaged pack is left alone: verify names it
        sound.append(pack)
        for seq in index.seqs:
            packed.setdefault(seq, pack)
    duplicates = tuple(f for f in loose if f.seq in packed and _same_copy(paths, catalog, f))
    loose = [f for f in loose if f.seq not in packed]
    # The newest files stay loose: the newest seq (the writer continues after it) and
    # latest's target (a reader opens it first), plus keep_loose - 1 more.
    keep = {f.seq for f in loose[-max(1, keep_loose) :]}
    target = fsio.read_link(paths.latest)
    latest = parse_checkpoint_name(target) if target else None
    if latest is not None:
        keep.add(latest.seq)
    newest_packed = max(packed, default=0)
    chosen: list[PackEntry] = []
    total = 0
    for file in loose:
        # Only a prefix of the loose files: a pack never holds a seq above a loose
        # file's, so packed checkpoints never depend on loose ones (bases are older).
        if file.seq in keep or file.seq < newest_packed:
            break
        if keep_from is not None and file.seq >= keep_from:
            break
        image = _packable(paths, file)
        if image is None:
            break
        chosen.append(PackEntry(file.seq, file.phase, image))
        total += len(image)
    merge: list[PackFile] = []
    for pack in sorted(sound, key=lambda p: p.first, reverse=True):
        size = catalog.pack_reader(pack).index.size
        if not full and size >= 2 * max(total, 1):
            break  # geometric: an older pack stays once it is twice the newer content
        if total + size > MAX_PACK_INPUT_BYTES:
            break
        merge.append(pack)
        total += size
    if not chosen and len(merge) <= 1:
        merge = []  # nothing new, and nothing to merge with
    return _Plan(tuple(chosen), tuple(merge), duplicates)


def _same_copy(paths: RunPaths, catalog: RunCatalog, file: CheckpointFile) -> bool:
    """True when a pack holds exactly ``file``'s bytes (a crash left both copies)."""
    try:
        packed = catalog.packed(file.seq)
        if packed is None or packed.name != file.name:
            return False
        return catalog.packed_image(packed) == fsio.read_bounded(
            paths.dir / file.name, MAX_ENTRY_BYTES
        )
    except (OSError, ValueError, CheckpointCorruptionError):
        return False


def _packable(paths: RunPaths, file: CheckpointFile) -> bytes | None:
    """The bytes of a loose file that can go into a pack: a sound checkpoint frame,
    not too large. None otherwise (it stays loose, where verify names it)."""
    try:
        data = fsio.read_bounded(paths.dir / file.name, MAX_ENTRY_BYTES)
        codec.unpack_frame(data, file.name, expect_kind=codec.KIND_CHECKPOINT)
    except (OSError, ValueError, CheckpointCorruptionError):
        return None
    return data


def _write_packs(
    paths: RunPaths, record_codec: RecordCodec, catalog: RunCatalog, plan: _Plan, env: fsio.Env
) -> list[str]:
    """Write and publish the new pack(s); each durable before this returns."""
    entries: list[PackEntry] = []
    for pack in sorted(plan.merge, key=lambda p: p.first):
        index = catalog.pack_reader(pack).index
        for block in index.blocks:
            raw = read_block(index.path, block)
            at = 0
            for entry in range(block.first_entry, block.first_entry + block.entry_count):
                length = index.lengths[entry]
                entries.append(
                    PackEntry(index.seqs[entry], index.phase(entry), raw[at : at + length])
                )
                at += length
    entries += plan.loose
    unique = {e.seq: e for e in reversed(entries)}  # overlapping packs a crash left: once
    written = []
    for chunk in _chunks([unique[seq] for seq in sorted(unique)]):
        name, data = encode_pack(chunk, run_id=paths.run_id, signer=record_codec.signer)
        if not (paths.dir / name).exists():  # identical content is already published
            env.atomic_write(paths.dir / name, data)
        written.append(name)
    return written


def drop_from_packs(
    paths: RunPaths,
    record_codec: RecordCodec,
    catalog: RunCatalog,
    drop: set[int],
    env: fsio.Env = fsio.DEFAULT_ENV,
) -> list[str]:
    """Publish, for every pack holding a seq of ``drop``, a pack without those entries.

    Returns the names of the packs replaced. The caller removes them once nothing
    still needs them (compaction: after the loose files it deletes): until then both
    copies exist, which readers accept, so a crash in between loses nothing.

    Raises:
        CheckpointCorruptionError: a pack to rewrite is damaged (nothing was changed).
    """
    replaced = []
    for pack in catalog.packs():
        if not drop or not any(pack.first <= seq <= pack.last for seq in drop):
            continue
        reader = catalog.pack_reader(pack)
        index = reader.index
        if not any(seq in drop for seq in index.seqs):
            continue
        kept = [
            PackEntry(seq, index.phase(i), reader.image(i))
            for i, seq in enumerate(index.seqs)
            if seq not in drop
        ]
        for chunk in _chunks(kept):
            name, data = encode_pack(chunk, run_id=paths.run_id, signer=record_codec.signer)
            env.atomic_write(paths.dir / name, data)
        replaced.append(pack.name)
    return replaced


def _chunks(entries: list[PackEntry]) -> list[list[PackEntry]]:
    chunks: list[list[PackEntry]] = [[]]
    size = 0
    for entry in entries:
        if chunks[-1] and (
            size + len(entry.image) > MAX_PACK_INPUT_BYTES or len(chunks[-1]) >= MAX_PACK_ENTRIES
        ):
            chunks.append([])
            size = 0
        chunks[-1].append(entry)
        size += len(entry.image)
    return [c for c in chunks if c]


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


__all__ = ["DEFAULT_LOOSE_LIMIT", "PackReport", "drop_from_packs", "pack_run"]
