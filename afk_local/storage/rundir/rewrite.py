"""Publishing a rewrite of a run: new packs, then the manifest, then deletions (DESIGN §11).

Every rewrite of a run's checkpoints (packing, merging packs, gc dropping or rewriting
packed checkpoints) goes through the same three steps, each durable before the next:

1. :func:`write_packs`: the new packs are written (temp, fsync, rename) and the
   directory fsynced. A pack already on disk under the same name is written again: an
   earlier packer may have died after its rename and before its directory fsync, and a
   pack whose directory entry is not durable must never back a deletion.
2. :func:`publish_manifest`: the new ``MANIFEST`` (which packs and which loose range
   are live, :mod:`afk_local.storage.format.manifest`) is written the same way. This
   rename is the instant the rewrite happens for every reader.
3. :func:`remove_garbage`: only now is anything deleted: the packs the manifest does
   not name and the loose files below its ``loose_from``. Nothing live depends on them,
   so they go in any order; a crash leaves garbage that readers ignore and the next
   rewrite removes.

A crash before step 2 leaves the old manifest (or none) in force, with every file it
names untouched; after it, the new one, with every file it names durable.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from afk_local.storage import fsio
from afk_local.storage.format.integrity import Signer
from afk_local.storage.format.layout import (
    CheckpointFile,
    PackFile,
    RunPaths,
    parse_pack_name,
    scan_run_files,
)
from afk_local.storage.format.manifest import MAX_MANIFEST_PACKS, Manifest, encode_manifest
from afk_local.storage.format.pack import (
    MAX_PACK_ENTRIES,
    MAX_PACK_INPUT_BYTES,
    PackEntry,
    encode_pack,
)

log = logging.getLogger("afk_local")


def chunks(entries: Sequence[PackEntry]) -> list[list[PackEntry]]:
    """``entries`` cut into the packs they fill (size and count bounds of one pack)."""
    out: list[list[PackEntry]] = [[]]
    size = 0
    for entry in entries:
        if out[-1] and (
            size + len(entry.image) > MAX_PACK_INPUT_BYTES or len(out[-1]) >= MAX_PACK_ENTRIES
        ):
            out.append([])
            size = 0
        out[-1].append(entry)
        size += len(entry.image)
    return [c for c in out if c]


def write_packs(
    paths: RunPaths, entries: Sequence[PackEntry], signer: Signer | None, env: fsio.Env
) -> list[str]:
    """Write ``entries`` (rising seqs) into new packs, durable when this returns (step 1).

    Returns the names of the packs, in seq order.
    """
    written: list[str] = []
    for chunk in chunks(entries):
        name, data = encode_pack(chunk, run_id=paths.run_id, signer=signer)
        env.atomic_write(paths.dir / name, data, sync_dir=False)
        written.append(name)
    if written:
        env.fsync_dir(paths.dir)
    return written


def publish_manifest(
    paths: RunPaths,
    previous: Manifest | None,
    packs: Sequence[str],
    loose_from: int,
    *,
    signer: Signer | None,
    env: fsio.Env,
) -> Manifest:
    """Publish the manifest naming ``packs`` and ``loose_from`` (step 2); durable on return.

    Raises:
        ValueError: the packs overlap, reach ``loose_from`` or are too many (a bug in
            the rewrite: nothing was published).
    """
    ordered = sorted(set(packs), key=lambda n: parse_pack_name(n) or n)
    if len(ordered) > MAX_MANIFEST_PACKS:
        raise ValueError(f"run {paths.run_id}: {len(ordered)} packs, over {MAX_MANIFEST_PACKS}")
    manifest = Manifest(
        run_id=paths.run_id,
        generation=(previous.generation + 1) if previous is not None else 1,
        loose_from=loose_from,
        packs=tuple(ordered),
    )
    env.atomic_write(paths.manifest, encode_manifest(manifest, signer))
    return manifest


def garbage(
    paths: RunPaths,
    manifest: Manifest,
    listing: tuple[Sequence[CheckpointFile], Sequence[PackFile]] | None = None,
) -> list[str]:
    """The files of the run that ``manifest`` makes garbage: unnamed packs, loose below it.

    ``listing``: the run's files as the caller listed them under the lock (what only it
    added since, its new packs, cannot be garbage); None lists the directory now.
    """
    loose, packs = scan_run_files(paths.dir) if listing is None else listing
    live = set(manifest.packs)
    doomed = [p.name for p in packs if p.name not in live]
    doomed += [f.name for f in loose if f.seq < manifest.loose_from]
    return doomed


def remove_garbage(
    paths: RunPaths,
    manifest: Manifest,
    env: fsio.Env,
    *,
    just_published: bool,
    sync: bool,
    listing: tuple[Sequence[CheckpointFile], Sequence[PackFile]] | None = None,
) -> int:
    """Delete what ``manifest`` makes garbage (step 3); returns how many files went.

    Args:
        just_published: the caller published ``manifest`` itself a moment ago. When it
            did not (a manifest found on disk), the directory is fsynced first: the
            rename that published it may not be durable yet, and deleting what the
            previous manifest named before it is would lose data on a power cut.
        sync: fsync the directory after the deletions (a writer leaves that to its next
            checkpoint's directory fsync; nothing live depends on them).
        listing: as for :func:`garbage`.
    """
    doomed = garbage(paths, manifest, listing)
    if not doomed:
        return 0
    if not just_published:
        env.fsync_dir(paths.dir)
    fsio.unlink_names(env, str(paths.dir) + os.sep, doomed)
    if sync:
        env.fsync_dir(paths.dir)
    log.debug("run %s: removed %d file(s) no manifest names", paths.run_id, len(doomed))
    return len(doomed)


__all__ = [
    "chunks",
    "garbage",
    "publish_manifest",
    "remove_garbage",
    "write_packs",
]
