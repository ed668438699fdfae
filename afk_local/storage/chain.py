"""Following a checkpoint's chains: its delta chain and its signature chain link.

A delta checkpoint is decoded by walking back through its bases to a keyframe
(or a cached base) and decompressing forward; a keyed checkpoint's MAC chains
on its predecessor's MAC, which is read from that file's trailer without
decoding it. :class:`ChainDecoder` does both for one run directory with a
small cache; :class:`~afk_local.storage.reader.RunReader` builds on it. Nothing here
checks a signature: the reader does.
"""

from __future__ import annotations

import os
from collections import OrderedDict

from afk_local.errors import CheckpointCorruptionError
from afk_local.storage import codec, fsio
from afk_local.storage.catalog import PACK_SEPARATOR, RunCatalog
from afk_local.storage.integrity import NO_MAC
from afk_local.storage.layout import CheckpointFile, RunPaths, scan_checkpoints
from afk_local.storage.records import Phase

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_HARD_CHAIN_LIMIT = 100_000  # far above any max_chain a writer uses; stops a crafted loop
_PHASE_GUESSES = tuple(p.value for p in Phase)
# A checkpoint's predecessor (for the signature chain): runtime_state is its most common phase.
_LINK_GUESSES = (Phase.RUNTIME_STATE.value, *_PHASE_GUESSES)


class ChainDecoder:
    """Decodes checkpoint files to record bytes, following delta chains with a small cache.

    Checkpoints are read loose or, when their file is gone, from the run's packs
    (through ``catalog``); a chain may cross from one to the other.

    Args:
        paths: the run directory.
        max_bytes: the largest decoded record accepted (``max_record_bytes``).
        cache_bytes: how many decoded bytes of bases to keep for later deltas.
        catalog: the run's loose and packed checkpoints (default: one of its own).
    """

    def __init__(
        self,
        paths: RunPaths,
        max_bytes: int,
        cache_bytes: int = 64 << 20,
        catalog: RunCatalog | None = None,
    ) -> None:
        self._paths = paths
        self.catalog = catalog or RunCatalog(paths)
        self._max_bytes = max_bytes
        self._max_file_bytes = max_bytes + (max_bytes >> 7) + 4096  # zstd worst-case growth
        self._cache: OrderedDict[int, bytes] = OrderedDict()
        self._cache_bytes = 0
        self._cache_limit = cache_bytes
        self._names: dict[int, CheckpointFile] | None = None
        self._dir = str(paths.dir) + os.sep

    def decode(self, seq: int, name: str, pack: str | None = None) -> tuple[bytes, bytes | None]:
        """The decoded record bytes of checkpoint ``seq`` and its file's MAC (None: unsigned).

        ``pack`` names the pack holding it (None: a loose file, or a pack if it is gone).
        The MAC is not checked here; only the file's own MAC is returned, because a
        delta's MAC covers its decoded bytes and so vouches for its bases too.
        """
        # Walk back from ``seq`` to a cached base or a keyframe, then decode forward.
        frames: list[tuple[int, str, bytes]] = []
        base: bytes | None = None
        cur_seq: int = seq
        path, data = self._read_checkpoint(seq, name, pack)
        mac: bytes | None = None
        while True:
            header, body = codec.unpack_frame(data, path, expect_kind=codec.KIND_CHECKPOINT)
            if not frames:
                mac = header.mac
            codec.check_content_size(body, path, self._max_bytes)
            frames.append((cur_seq, path, body))
            if not header.is_delta:
                break
            if header.base_seq >= cur_seq or len(frames) > _HARD_CHAIN_LIMIT:
                raise CheckpointCorruptionError(path, f"bad delta base {header.base_seq}")
            cur_seq = header.base_seq
            cached = self._cache.get(cur_seq)
            if cached is not None:
                self._cache.move_to_end(cur_seq)
                base = cached
                break
            found = self._read_base(cur_seq, path)
            if found is None:
                raise CheckpointCorruptionError(path, f"delta base checkpoint {cur_seq} is missing")
            path, data = found
        frames.reverse()
        if base is None and len(frames) > 1:
            # A cold chain from its keyframe: one C call decodes it (zstd content-dictionary chain).
            raw = codec.decompress_chain([body for _, _, body in frames], [p for _, p, _ in frames])
        else:
            current = base
            for _, frame_path, body in frames:
                current = codec.decompress(
                    body, frame_path, base=current, max_bytes=self._max_bytes
                )
            assert current is not None
            raw = current
        self._remember(seq, raw)
        return raw, mac

    def link(self, seq: int, hint: str, names: dict[int, str] | None = None) -> bytes | None:
        """The chain value checkpoint ``seq`` passes on: its MAC, :data:`NO_MAC` when it
        has none, None when there is no such file.

        Only the header and the trailer are read; the file's own MAC is checked when
        the file itself is loaded.
        """
        if names is not None:
            name = names.get(seq)
            if name is None:
                return None
            return read_link_value(self._dir + name) or self._packed_link(seq)
        for phase in dict.fromkeys((hint, *_LINK_GUESSES)):
            value = read_link_value(f"{self._dir}{seq:012d}.{phase}.ckpt")
            if value is not None:
                return value
        packed = self._packed_link(seq)
        if packed is not None:
            return packed
        # Not a usual phase: list (fresh, since a writer may have added it meanwhile).
        for file in scan_checkpoints(self._paths.dir):
            if file.seq == seq:
                return read_link_value(self._dir + file.name)
        return None

    def _packed_link(self, seq: int) -> bytes | None:
        try:
            file = self.catalog.packed(seq)
        except CheckpointCorruptionError:
            return NO_MAC  # a damaged pack claims it: nothing to chain on
        return None if file is None else self.catalog.link_value(file)

    def _read_checkpoint(self, seq: int, name: str, pack: str | None) -> tuple[str, bytes]:
        """Where checkpoint ``seq`` is and its file's bytes: loose, else from a pack."""
        if pack is None:
            path = self._dir + name
            try:
                return path, self._read_file(path)
            except FileNotFoundError:
                pass  # packed since it was listed, perhaps
        file = self.catalog.packed(seq)
        if file is None or file.name != name:
            raise CheckpointCorruptionError(self._dir + name, "file vanished while reading")
        return self.catalog.location(file), self.catalog.packed_image(file)

    def _read(self, path: str) -> bytes:
        try:
            return self._read_file(path)
        except FileNotFoundError:
            raise CheckpointCorruptionError(path, "file vanished while reading") from None

    def _read_file(self, path: str) -> bytes:
        """A loose file's bytes (FileNotFoundError when it does not exist)."""
        try:
            return fsio.read_bounded(path, self._max_file_bytes)
        except FileNotFoundError:
            raise
        except ValueError as exc:
            raise CheckpointCorruptionError(path, str(exc)) from None
        except OSError as exc:
            raise CheckpointCorruptionError(path, f"cannot read: {exc.strerror}") from None

    def _read_base(self, seq: int, dependent: str) -> tuple[str, bytes] | None:
        """The path and bytes of checkpoint ``seq`` (a delta's base), or None if missing."""
        if self._names is None:
            if PACK_SEPARATOR in dependent:  # a packed delta's base is packed too
                packed = self.catalog.packed(seq)
                if packed is not None:
                    return self._read_checkpoint(seq, packed.name, packed.pack)
            # Guess the base's phase first: an open per guess beats listing a huge directory.
            hint = dependent.rsplit(".", 2)[-2]
            for phase in (hint, *_PHASE_GUESSES):
                path = f"{self._dir}{seq:012d}.{phase}.ckpt"
                try:
                    return path, fsio.read_bounded(path, self._max_file_bytes)
                except FileNotFoundError:
                    if phase == hint:  # not loose under its likely name: packed?
                        packed = self.catalog.packed(seq)
                        if packed is not None:
                            return self._read_checkpoint(seq, packed.name, packed.pack)
                    continue
                except (OSError, ValueError):
                    break
            self._names = {f.seq: f for f in self.catalog.files()}
        file = self._names.get(seq)
        if file is None:
            return None
        return self._read_checkpoint(seq, file.name, file.pack)

    def _remember(self, seq: int, raw: bytes) -> None:
        if len(raw) > self._cache_limit:
            return
        self._cache[seq] = raw
        self._cache_bytes += len(raw)
        while self._cache_bytes > self._cache_limit or len(self._cache) > 256:
            _, dropped = self._cache.popitem(last=False)
            self._cache_bytes -= len(dropped)


def read_link_value(path: str) -> bytes | None:
    """The chain value a checkpoint file passes on (see :meth:`ChainDecoder.link`).

    Its MAC trailer, or :data:`~afk_local.storage.integrity.NO_MAC` when it has no sound one;
    None when the file does not exist. Reads the header and the trailer only.
    """
    try:
        fd = os.open(path, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError:
        return NO_MAC
    try:
        size = os.fstat(fd).st_size
        at = codec.signature_offset(os.pread(fd, codec.HEADER_SIZE, 0), size)
        if at is None:
            return NO_MAC
        mac = os.pread(fd, size - at, at)
        return mac if len(mac) == size - at else NO_MAC
    except OSError:
        return NO_MAC
    finally:
        os.close(fd)


def is_signed_file(path: str | os.PathLike[str]) -> bool:
    """True when a checkpoint or meta file's header has the signed flag (nothing checked)."""
    try:
        fd = os.open(path, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC)
    except OSError:
        return False
    try:
        head = os.pread(fd, codec.HEADER_SIZE, 0)
        return codec.signature_offset(head, os.fstat(fd).st_size) is not None
    except OSError:
        return False
    finally:
        os.close(fd)
