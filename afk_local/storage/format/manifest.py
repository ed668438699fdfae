"""The ``MANIFEST`` of a run: which packs and which loose range are live (docs/format.md).

A run that was never packed has no manifest: every loose checkpoint file is live.
Every rewrite of a run (pack, merge, gc compaction, keyframe rewrite inside a pack)
publishes a new manifest, as LevelDB publishes its MANIFEST or restic its index,
*before* it deletes anything it made obsolete::

    AFK1 frame, kind 3, no flags, base_seq 0, body = msgpack of
    {"version": 1, "run_id": str, "generation": int, "loose_from": int, "packs": [str]}
    (+ a 32-byte HMAC trailer in a keyed store)

The rule that follows (normative): checkpoint ``seq`` is live

- in the named pack that holds it, when ``seq < loose_from``;
- as its loose file, when ``seq >= loose_from``.

Any other copy (a loose file below ``loose_from``, a pack the manifest does not name)
is garbage a crash left behind: readers ignore it and the next rewrite removes it.
There is never a choice between two copies, so two copies can never disagree.

Everything read is bounded (file size, pack count, seq ranges) and checked; a bad
manifest raises :class:`~afk_local.errors.CheckpointCorruptionError` naming it.
"""

from __future__ import annotations

import msgspec

from afk_local.errors import CheckpointCorruptionError
from afk_local.storage.format import codec
from afk_local.storage.format.integrity import Signer
from afk_local.storage.format.layout import MAX_SEQ, PackFile, parse_pack_name

MANIFEST_VERSION = 1
MAX_MANIFEST_PACKS = 4096
"""Packs one manifest may name (geometric merging keeps a run at O(log n) packs)."""
MAX_MANIFEST_BYTES = 1 << 20
"""Largest manifest file a reader accepts (4096 pack names take ~200 KB)."""
_DOCUMENT_TAG = "manifest/"  # + run id: a manifest signs for one run only


class Manifest(msgspec.Struct, frozen=True):
    """The live packs and loose range of one run (see the module docstring)."""

    run_id: str
    generation: int
    """Rises by one with every published manifest (for people and for tests)."""
    loose_from: int
    """Seqs from here on are live as loose files; below it, in a named pack."""
    packs: tuple[str, ...]
    """The live pack files, by name, in seq order; their ranges do not overlap."""
    version: int = MANIFEST_VERSION

    def pack_files(self) -> list[PackFile]:
        """The named packs, parsed (names were checked when the manifest was read)."""
        return [p for p in (parse_pack_name(n) for n in self.packs) if p is not None]

    def is_live_loose(self, seq: int) -> bool:
        """True when a loose file of ``seq`` is the live copy."""
        return seq >= self.loose_from


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(Manifest)


def encode_manifest(manifest: Manifest, signer: Signer | None = None) -> bytes:
    """The complete bytes of a ``MANIFEST`` file (signed for its run in a keyed store).

    Raises:
        ValueError: the manifest breaks a bound :func:`decode_manifest` checks.
    """
    check_manifest(manifest, "MANIFEST")
    body = _ENCODER.encode(manifest)
    mac = None if signer is None else signer.document_mac(_DOCUMENT_TAG + manifest.run_id, body)
    return codec.pack_frame(codec.KIND_MANIFEST, body, mac=mac)


def decode_manifest(data: bytes, path: str, *, run_id: str, signer: Signer | None) -> Manifest:
    """Check and decode the bytes of ``path``, the ``MANIFEST`` of run ``run_id``.

    Raises:
        CheckpointCorruptionError: naming ``path`` and what is wrong (bad frame, crc,
            signature, fields out of range, another run's manifest).
    """
    if len(data) > MAX_MANIFEST_BYTES:
        raise CheckpointCorruptionError(path, f"{len(data)} bytes, over {MAX_MANIFEST_BYTES}")
    header, body = codec.unpack_frame(data, path, expect_kind=codec.KIND_MANIFEST)
    if header.base_seq:
        raise CheckpointCorruptionError(path, "a manifest has no base")
    if signer is not None:
        if header.mac is None:
            raise CheckpointCorruptionError(path, codec.UNSIGNED_REASON)
        if not signer.matches(signer.document_mac(_DOCUMENT_TAG + run_id, body), header.mac):
            raise CheckpointCorruptionError(
                path, "HMAC mismatch: edited, copied from another run, or signed with another key"
            )
    try:
        manifest = _DECODER.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise CheckpointCorruptionError(path, f"undecodable manifest: {exc}") from None
    if manifest.run_id != run_id:
        raise CheckpointCorruptionError(
            path, f"manifest of run {manifest.run_id!r}, found in run {run_id!r}"
        )
    try:
        check_manifest(manifest, path)
    except ValueError as exc:
        raise CheckpointCorruptionError(path, str(exc)) from None
    return manifest


def check_manifest(manifest: Manifest, path: str) -> None:
    """Raise ValueError when ``manifest``'s fields are out of range or inconsistent."""
    if manifest.version != MANIFEST_VERSION:
        raise ValueError(f"{path}: manifest version {manifest.version}, expected 1")
    if not 1 <= manifest.generation <= 1 << 62:
        raise ValueError(f"{path}: generation {manifest.generation} out of range")
    if not 1 <= manifest.loose_from <= MAX_SEQ + 1:
        raise ValueError(f"{path}: loose_from {manifest.loose_from} out of range")
    if len(manifest.packs) > MAX_MANIFEST_PACKS:
        raise ValueError(f"{path}: names {len(manifest.packs)} packs, over {MAX_MANIFEST_PACKS}")
    previous = 0
    for name in manifest.packs:
        pack = parse_pack_name(name)
        if pack is None:
            raise ValueError(f"{path}: {name[:80]!r} is not a pack name")
        if pack.first <= previous:
            raise ValueError(f"{path}: pack {name} overlaps or is out of order")
        if pack.last >= manifest.loose_from:
            raise ValueError(f"{path}: pack {name} reaches loose_from {manifest.loose_from}")
        previous = pack.last


__all__ = [
    "MANIFEST_VERSION",
    "MAX_MANIFEST_BYTES",
    "MAX_MANIFEST_PACKS",
    "Manifest",
    "check_manifest",
    "decode_manifest",
    "encode_manifest",
]
