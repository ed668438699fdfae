"""Where a run's checkpoints are: loose files and pack files, one list for readers.

A checkpoint is *loose* (its own ``<seq>.<phase>.ckpt`` file) or *packed* (its exact
file bytes inside a ``pack-*.pack`` file, see :mod:`afk_local.storage.format.pack`); it keeps
its name either way. :class:`RunCatalog` lists both and hands out the bytes of
either, so the chain decoder, the reader, verify, gc and fork treat them alike.

Which copy is live is the run's ``MANIFEST``'s to say
(:mod:`afk_local.storage.format.manifest`): below its ``loose_from`` a seq lives in a
named pack, from it on as a loose file; every other copy is garbage and ignored. A run
without a manifest (never rewritten since packs got one, or never packed) is read as
before: every loose file is live and, for a seq found loose and in a pack, the loose
file is used. Listings stat ``MANIFEST`` and read it only when it changed; reading
``latest``'s target never lists, so a cold read of one run costs no extra read.

Lock-free readers race rewrites: a pack or loose file named by one listing may be gone
by the time it is read. The catalog then lists again, through the manifest, and looks
for the seq where the new view says it is (:meth:`RunCatalog.view_token` lets callers
see that the view moved).
"""

from __future__ import annotations

import enum
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from afk_local.errors import CheckpointCorruptionError, RunNotFoundError
from afk_local.storage import fsio
from afk_local.storage.format import codec
from afk_local.storage.format.integrity import NO_MAC, Signer
from afk_local.storage.format.layout import (
    CheckpointFile,
    PackFile,
    RunPaths,
    checkpoint_name,
    scan_run_files,
)
from afk_local.storage.format.manifest import (
    MAX_MANIFEST_BYTES,
    Manifest,
    decode_manifest,
)

# The pack format is imported when a pack is first opened: a run of loose files (most
# runs, and every cold read of one) never needs it.
if TYPE_CHECKING:
    from afk_local.storage.format.pack import BlockCache, PackReader

PACK_SEPARATOR = "#"
"""Between a pack's path and a checkpoint's name in the location of a packed checkpoint."""
_VIEW_ATTEMPTS = 8  # listings tried at once while rewrites keep replacing what it names
_VIEW_PATIENCE_S = 2.0
"""Then more listings, a short sleep apart, for up to this long while ``MANIFEST`` keeps
changing: a writer packing every few checkpoints on a fast disk rewrites a run every
millisecond, and a lock-free reader that lost eight races in a row to it must not call
that damage. A manifest that stays the same names damage: that is said at once."""


def _view_attempts(manifest: str) -> Iterator[int]:
    """The attempts of a listing that rewrites may keep invalidating (see above)."""
    started = time.monotonic()
    attempt, seen = 0, _identity(manifest)
    while True:
        if attempt >= _VIEW_ATTEMPTS:
            now = _identity(manifest)
            if now == seen or time.monotonic() - started >= _VIEW_PATIENCE_S:
                return  # nothing rewrote the run since the last try, or it is past patience
            seen = now
            time.sleep(min(0.0005 * 2 ** (attempt - _VIEW_ATTEMPTS), 0.02))
        yield attempt
        attempt += 1


def _identity(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


class _Vanished(enum.Enum):
    VANISHED = "vanished"


_VANISHED = _Vanished.VANISHED
"""A pack listed as live was gone when it was opened: list again."""


class RunCatalog:
    """The loose and packed checkpoints of one run directory.

    Args:
        paths: the run directory.
        signer: a keyed store's signer: packs must then carry a valid MAC.
        owners: the run ids a pack's MAC may name (the run and its fork ancestors,
            whose packs a fork shares); called when a pack is first opened.
    """

    def __init__(
        self,
        paths: RunPaths,
        *,
        signer: Signer | None = None,
        owners: Callable[[], Sequence[str]] | None = None,
    ) -> None:
        self.paths = paths
        self._prefix = str(paths.dir) + os.sep
        self._signer = signer
        self._owners = owners or (lambda: (paths.run_id,))
        self._readers: dict[str, PackReader] = {}
        self._blocks: BlockCache | None = None  # one byte bound for all of the run's packs
        self._damaged: dict[str, str] = {}
        self._listed: list[PackFile] | None = None
        self.scanned: tuple[list[CheckpointFile], list[PackFile]] | None = None  # last scan()
        self._manifest: Manifest | None = None
        self._manifest_id: tuple[int, int, int] | None = None
        self.manifest_problem: CheckpointCorruptionError | None = None
        """Why the last listing could not follow the manifest (damaged, or naming a pack
        that is gone): it was then read by the rule of a run without one. Readers go on
        with what they can read, verify reports it, rewrites refuse to run on a guess."""

    # -- listing ----------------------------------------------------------------------

    def scan(self) -> tuple[list[CheckpointFile], list[PackFile]]:
        """List the directory: its loose checkpoint files and its pack files, in order.

        Every file is listed, live or not; :meth:`live` applies the manifest. Raises
        RunNotFoundError when the run's directory is gone (deleted while it was read).
        """
        try:
            loose, packs = scan_run_files(self.paths.dir)
        except FileNotFoundError:
            raise RunNotFoundError(self.paths.run_id, str(self.paths.dir.parent.parent)) from None
        names = {p.name for p in packs}
        for gone in [n for n in self._readers if n not in names]:
            del self._readers[gone]
        for gone in [n for n in self._damaged if n not in names]:
            del self._damaged[gone]
        self.scanned = (loose, packs)
        return loose, packs

    # -- the manifest -----------------------------------------------------------------

    def manifest(self) -> Manifest | None:
        """The run's manifest as it is on disk now (None: the run has none).

        Raises:
            CheckpointCorruptionError: it is damaged, oversized or not this run's.
        """
        path = str(self.paths.manifest)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            self._manifest = self._manifest_id = None
            return None
        except OSError as exc:
            raise CheckpointCorruptionError(path, f"cannot read: {exc.strerror}") from None
        identity = (st.st_ino, st.st_mtime_ns, st.st_size)
        if identity == self._manifest_id and self._manifest is not None:
            return self._manifest
        try:
            data = fsio.read_bounded(path, MAX_MANIFEST_BYTES)
        except FileNotFoundError:  # replaced between the stat and the open: read the new one
            return self.manifest()
        except (OSError, ValueError) as exc:
            raise CheckpointCorruptionError(path, f"cannot read: {exc}") from None
        manifest = decode_manifest(data, path, run_id=self.paths.run_id, signer=self._signer)
        self._manifest, self._manifest_id = manifest, identity
        return manifest

    def view_token(self) -> tuple[object, ...]:
        """Something that changes whenever a rewrite changes the run: compare two to see
        one ran. It names the manifest, the packs and the loose files, since gc deletes
        loose checkpoints (and rewrites kept deltas) without touching a pack or the
        manifest: a file that vanished while the token stayed was lost, not moved."""
        try:
            st = os.lstat(self.paths.manifest)
            manifest_id: object = (st.st_ino, st.st_mtime_ns, st.st_size)
        except OSError:
            manifest_id = None
        try:
            loose, packs = scan_run_files(self.paths.dir)
        except OSError:
            loose, packs = [], []
        return (manifest_id, tuple(p.name for p in packs), tuple(f.name for f in loose))

    def live(self) -> tuple[list[CheckpointFile], list[PackFile], Manifest | None]:
        """The live loose files and live packs, through the manifest, and the manifest.

        Without a manifest (a run never packed) every loose file and every pack is live.
        A manifest that is damaged or names a missing pack (after listing again, in case
        a rewrite replaced it meanwhile) is set aside: :attr:`manifest_problem` says why,
        and the run is listed as if it had none (every copy of a seq decodes the same, so
        a reader loses nothing it could read).
        """
        self.manifest_problem = None
        missing = ""
        for _ in _view_attempts(str(self.paths.manifest)):
            loose, packs = self.scan()
            try:
                manifest = self.manifest()  # a failed lstat for a run never packed
            except CheckpointCorruptionError as exc:
                self.manifest_problem = exc
                manifest = None
            if manifest is None:
                self._listed = packs
                return loose, packs, None
            names = {p.name for p in packs}
            missing = next((n for n in manifest.packs if n not in names), "")
            if not missing:
                live = manifest.pack_files()
                self._listed = live
                return [f for f in loose if f.seq >= manifest.loose_from], live, manifest
            # Listed before a rewrite published, or after it removed what this manifest
            # named: the manifest read now is newer; list again.
        self.manifest_problem = CheckpointCorruptionError(
            str(self.paths.manifest), f"names pack {missing}, which is missing"
        )
        self._listed = packs
        return loose, packs, None

    def loose_from(self) -> int:
        """The lowest seq whose loose file is live (1 when the run has no manifest).

        A stat of ``MANIFEST`` (and a read when it changed): readers call it only to
        find a delta's base.
        """
        try:
            manifest = self.manifest()
        except CheckpointCorruptionError:
            return 1  # set aside, as live() does
        return 1 if manifest is None or self.manifest_problem is not None else manifest.loose_from

    def files(self) -> list[CheckpointFile]:
        """Every live checkpoint, loose or packed, in seq order (each seq once).

        A live pack that is gone by the time its index is read was merged away by a
        rewrite that published after this listing: the listing is taken again (a
        listing that went on without it would silently miss the seqs it held, and
        their loose files are gone too). A damaged pack is passed over (see
        :meth:`damaged_packs`).
        """
        for _ in _view_attempts(str(self.paths.manifest)):
            listed = self._files_once()
            if listed is not None:
                return listed
        raise CheckpointCorruptionError(
            str(self.paths.dir),
            f"rewrites replaced its packs under every listing for {_VIEW_PATIENCE_S:g} s",
            self.paths.run_id,
            moved=True,
        )

    def _files_once(self) -> list[CheckpointFile] | None:
        """One listing, or None when a live pack vanished while it was listed."""
        loose, packs, manifest = self.live()
        found = {f.seq: f for f in loose}
        for pack in packs if manifest is not None else self._preferred(packs):
            try:
                reader = self.pack_reader(pack)
            except FileNotFoundError:
                self._listed = None
                return None
            except CheckpointCorruptionError as exc:
                self._damaged[pack.name] = exc.reason
                continue
            index = reader.index
            for entry, seq in enumerate(index.seqs):
                if seq not in found:
                    phase = index.phase(entry)
                    found[seq] = CheckpointFile(
                        seq, phase, checkpoint_name(seq, phase), pack=pack.name
                    )
        return [found[seq] for seq in sorted(found)]

    def packs(self) -> list[PackFile]:
        """The pack files of the directory (listed afresh)."""
        return self.scan()[1]

    def damaged_packs(self) -> dict[str, str]:
        """Pack name -> why it could not be opened, for the packs met so far."""
        return dict(self._damaged)

    def pack_reader(self, pack: PackFile | str) -> PackReader:
        """The reader of one pack of this run (its header and index checked).

        Raises:
            CheckpointCorruptionError: the pack is damaged.
            FileNotFoundError: it is gone.
        """
        name = pack if isinstance(pack, str) else pack.name
        reader = self._readers.get(name)
        if reader is None:
            from afk_local.storage.format.pack import (  # noqa: PLC0415
                BlockCache,
                PackReader,
                read_pack_index,
            )

            self._damaged.pop(name, None)
            path = self._prefix + name
            signer = self._signer
            owners = self._owners() if signer is not None else ()
            if self._blocks is None:
                self._blocks = BlockCache()
            index = read_pack_index(path, signer=signer, owners=owners)
            reader = PackReader(index, self._blocks)
            self._readers[name] = reader
        return reader

    def find(self, seq: int) -> CheckpointFile | None:
        """Live checkpoint ``seq``, loose or packed, or None when the run has none.

        Raises:
            CheckpointCorruptionError: a damaged pack's name claims ``seq``.
        """
        for _ in _view_attempts(str(self.paths.manifest)):
            loose, packs, _ = self.live()
            for file in loose:
                if file.seq == seq:
                    return file
            found = self._packed(seq, packs)
            if found is not _VANISHED:
                return found
        return None  # rewrites kept replacing its packs: as if gone (the caller says so)

    def packed(self, seq: int) -> CheckpointFile | None:
        """Live checkpoint ``seq`` if a live pack holds it (no listing when a known pack does).

        Raises:
            CheckpointCorruptionError: a damaged pack's name claims ``seq``.
        """
        if self._listed is not None and any(p.first <= seq <= p.last for p in self._listed):
            found = self._packed(seq, self._listed)
            if isinstance(found, CheckpointFile):
                return found
        for _ in _view_attempts(str(self.paths.manifest)):
            found = self._packed(seq, self.live()[1])
            if found is not _VANISHED:
                return found
        return None

    def _packed(self, seq: int, packs: list[PackFile]) -> CheckpointFile | _Vanished | None:
        """``seq`` in the live ``packs``; :data:`_VANISHED` when a pack that may hold it was
        removed after it was listed (a rewrite published meanwhile: list again)."""
        damage: CheckpointCorruptionError | None = None
        vanished = False
        for pack in self._preferred(p for p in packs if p.first <= seq <= p.last):
            try:
                index = self.pack_reader(pack).index
            except FileNotFoundError:
                vanished = True
                continue
            except CheckpointCorruptionError as exc:
                self._damaged[pack.name] = exc.reason
                damage = damage or exc
                continue
            entry = index.find(seq)
            if entry is not None:
                phase = index.phase(entry)
                return CheckpointFile(seq, phase, checkpoint_name(seq, phase), pack=pack.name)
        if vanished:
            self._listed = None
            return _VANISHED
        if damage is not None:
            raise damage
        return None

    def _preferred(self, packs: Iterable[PackFile]) -> list[PackFile]:
        # Wider packs first: after a crash in a merge, the merged pack is the one kept.
        found = list(packs)
        if len(found) > 1:
            found.sort(key=lambda p: (p.first - p.last, p.first))
        return found

    # -- bytes ------------------------------------------------------------------------

    def location(self, file: CheckpointFile) -> str:
        """Where ``file``'s bytes are, for messages: its path, or ``<pack path>#<name>``."""
        if file.pack is None:
            return self._prefix + file.name
        return f"{self._prefix}{file.pack}{PACK_SEPARATOR}{file.name}"

    def packed_image(self, file: CheckpointFile) -> bytes:
        """The exact file bytes of packed checkpoint ``file``.

        Raises:
            CheckpointCorruptionError: the pack or the block holding it is damaged, or
                the pack no longer holds it.
        """
        assert file.pack is not None
        for _ in _view_attempts(str(self.paths.manifest)):
            try:
                reader = self.pack_reader(file.pack)
                entry = reader.index.find(file.seq)
                if entry is None:
                    break
                return reader.image(entry)
            except FileNotFoundError:
                # Rewritten into another pack meanwhile: look for it in a fresh view.
                self._listed = None
                moved = self.packed(file.seq)
                if moved is None or moved.pack is None:
                    break
                file = moved
        raise CheckpointCorruptionError(self.location(file), "vanished while reading", moved=True)

    def stored_bytes(self, file: CheckpointFile, max_bytes: int) -> bytes:
        """The exact bytes stored for ``file``: its loose file (at most ``max_bytes``), or its
        entry in a pack.

        Raises:
            CheckpointCorruptionError: it cannot be read.
        """
        if file.pack is not None:
            return self.packed_image(file)
        path = self._prefix + file.name
        try:
            return fsio.read_bounded(path, max_bytes)
        except FileNotFoundError:
            self._listed = None
            packed = self.packed(file.seq)  # packed since it was listed, perhaps
            if packed is not None and packed.name == file.name:
                return self.packed_image(packed)
            raise CheckpointCorruptionError(
                path, "file vanished while reading", moved=True
            ) from None
        except (OSError, ValueError) as exc:
            raise CheckpointCorruptionError(path, f"cannot read: {exc}") from None

    def link_value(self, file: CheckpointFile) -> bytes:
        """The MAC trailer of packed checkpoint ``file`` (:data:`NO_MAC` when it has none)."""
        try:
            image = self.packed_image(file)
        except CheckpointCorruptionError:
            return NO_MAC
        at = codec.signature_offset(image[: codec.HEADER_SIZE], len(image))
        return NO_MAC if at is None else image[at:]


__all__ = ["PACK_SEPARATOR", "RunCatalog"]
