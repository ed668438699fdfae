"""Following a checkpoint's chains: its delta chain and its signature chain link.

A delta checkpoint is decoded by walking back through its bases to a keyframe
(or a cached base) and decompressing forward; a keyed checkpoint's MAC chains
on its predecessor's MAC, which is read from that file's trailer without
decoding it. :class:`ChainDecoder` does both for one run directory with a
small cache; :class:`~afk_local.storage.rundir.read.reader.RunReader` builds on it. Nothing here
checks a signature: the reader does.
"""

from __future__ import annotations

import contextlib
import os
from collections import OrderedDict
from collections.abc import Iterator
from typing import NamedTuple

from afk_local.errors import CheckpointCorruptionError, DecodeBudgetError
from afk_local.storage import fsio
from afk_local.storage.format import codec
from afk_local.storage.format.integrity import NO_MAC
from afk_local.storage.format.layout import CheckpointFile, RunPaths, scan_checkpoints
from afk_local.storage.format.records import Phase
from afk_local.storage.rundir.read.catalog import RunCatalog

MAX_READ_CHAIN = 1024
"""Longest delta chain a reader follows (writers default to 32 and may not exceed this):
a crafted chain longer than that is damage, not a reason to read a thousand files."""
_BATCH_BODY_BYTES = 16 << 20  # a cold chain this small is decoded in one zstd call
_PHASE_GUESSES = tuple(p.value for p in Phase)
# A checkpoint's predecessor (for the signature chain): runtime_state is its most common phase.
_LINK_GUESSES = (Phase.RUNTIME_STATE.value, *_PHASE_GUESSES)


class _Link(NamedTuple):
    """One checkpoint of a chain being read: a loose file, or an image from a pack."""

    seq: int
    name: str
    path: str  # the file, or ``<pack path>#<name>``: what messages name
    image: bytes | None  # a packed checkpoint's bytes; None: read the loose file


class ChainDecoder:
    """Decodes checkpoint files to record bytes, following delta chains with a small cache.

    Memory: a chain is followed back to its keyframe by reading headers only (every
    frame's declared size checked against ``max_bytes``, every base's against
    :data:`~afk_local.storage.format.codec.MAX_DELTA_BASE_BYTES`), then decoded forward, so
    decoding one record holds at most its own bound plus one base of at most 64 MiB.

    Checkpoints are read loose or, when their file is gone, from the run's packs
    (through ``catalog``); a chain may cross from one to the other. A packed
    checkpoint is held to the same bounds as a loose file.

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
        self._loose_from: int | None = None  # the manifest's, read once per decode
        self._dir = str(paths.dir) + os.sep
        self._budget: int | None = None
        self.frames_decoded = 0
        """Frames decompressed by this decoder so far (what a decode budget counts)."""

    @contextlib.contextmanager
    def budget(self, frames: int) -> Iterator[None]:
        """Allow at most ``frames`` frames to be followed or decoded inside the block.

        Past it :class:`DecodeBudgetError` is raised. Nested budgets keep the outer one.
        """
        if self._budget is not None:
            yield
            return
        self._budget = frames
        try:
            yield
        finally:
            self._budget = None

    def _spend(self, path: str) -> None:
        if self._budget is None:
            return
        if self._budget <= 0:
            raise DecodeBudgetError(
                str(self._paths.dir),
                f"gave up at {os.path.basename(path)}: this read followed more delta frames "
                "than its budget (crafted or badly damaged chains)",
            )
        self._budget -= 1

    def decode(self, seq: int, name: str, pack: str | None = None) -> tuple[bytes, bytes | None]:
        """The decoded record bytes of checkpoint ``seq`` and its file's MAC (None: unsigned).

        ``pack`` names the pack holding it (None: a loose file, or a pack if it is gone).
        The MAC is not checked here; only the file's own MAC is returned, because a
        delta's MAC covers its decoded bytes and so vouches for its bases too.
        """
        # Walk back from ``seq`` to a cached base or a keyframe, headers only.
        links: list[tuple[_Link, codec.FrameHeader]] = []
        base: bytes | None = None
        self._loose_from = None
        cur_seq = seq
        link = self._locate(seq, name, pack)
        while True:
            self._spend(link.path)
            header, declared, link = self._peek(link)
            if links and declared > codec.MAX_DELTA_BASE_BYTES:
                raise CheckpointCorruptionError(
                    links[-1][0].path,
                    f"delta base {os.path.basename(link.path)} declares {declared} bytes, over "
                    f"the {codec.MAX_DELTA_BASE_BYTES} no writer uses as a base",
                )
            links.append((link, header))
            if not header.is_delta:
                break
            if header.base_seq >= cur_seq:
                raise CheckpointCorruptionError(link.path, f"bad delta base {header.base_seq}")
            if len(links) >= MAX_READ_CHAIN:
                raise CheckpointCorruptionError(
                    link.path, f"delta chain longer than {MAX_READ_CHAIN} checkpoints"
                )
            cur_seq = header.base_seq
            cached = self._cache.get(cur_seq)
            if cached is not None:
                self._cache.move_to_end(cur_seq)
                base = cached
                break
            found = self._base(cur_seq, link.path)
            if found is None:
                raise CheckpointCorruptionError(
                    link.path, f"delta base checkpoint {cur_seq} is missing", moved=True
                )
            link = found
        links.reverse()
        mac: bytes | None = None
        small = sum(h.body_len for _, h in links) <= _BATCH_BODY_BYTES
        if base is None and len(links) > 1 and small:
            # A small cold chain from its keyframe: one C call decodes it.
            bodies = []
            for frame_link, expected in links:
                header, body = self._frame(frame_link, expected)
                bodies.append(body)
                mac = header.mac
            self.frames_decoded += len(bodies)
            raw = codec.decompress_chain(bodies, [lk.path for lk, _ in links])
        else:
            current = base
            for frame_link, expected in links:
                header, body = self._frame(frame_link, expected)
                mac = header.mac
                current = codec.decompress(
                    body, frame_link.path, base=current, max_bytes=self._max_bytes
                )
                del body
                self.frames_decoded += 1
            assert current is not None
            raw = current
        self._remember(seq, raw)
        return raw, mac

    def _locate(self, seq: int, name: str, pack: str | None) -> _Link:
        """Checkpoint ``seq`` as listed: a loose file (read when needed), or its packed image."""
        if pack is None:
            return _Link(seq, name, self._dir + name, None)
        file = self.catalog.packed(seq)
        if file is None or file.name != name:
            raise CheckpointCorruptionError(
                self._dir + name, "file vanished while reading", moved=True
            )
        return self._in_pack(file)

    def _in_pack(self, file: CheckpointFile) -> _Link:
        return _Link(
            file.seq, file.name, self.catalog.location(file), self.catalog.packed_image(file)
        )

    def _moved(self, link: _Link) -> _Link:
        """A loose file gone since it was listed: packed meanwhile (same name), or damage."""
        file = self.catalog.packed(link.seq)
        if file is None or file.name != link.name:
            raise CheckpointCorruptionError(link.path, "file vanished while reading", moved=True)
        return self._in_pack(file)

    def _peek(self, link: _Link) -> tuple[codec.FrameHeader, int, _Link]:
        """The frame header of ``link`` and its declared decoded size, both bounded."""
        if link.image is None:
            try:
                fd = fsio.open_regular(link.path)
            except FileNotFoundError:
                return self._peek(self._moved(link))
            except OSError as exc:
                raise CheckpointCorruptionError(link.path, f"cannot read: {exc.strerror}") from None
            try:
                size = os.fstat(fd).st_size
                head = os.pread(fd, codec.PEEK_SIZE, 0)
            finally:
                os.close(fd)
        else:
            size, head = len(link.image), link.image[: codec.PEEK_SIZE]
        if size > self._max_file_bytes:
            raise CheckpointCorruptionError(
                link.path, f"{size} bytes, over the bound of {self._max_file_bytes}"
            )
        header, declared = codec.peek_frame(
            head, size, link.path, expect_kind=codec.KIND_CHECKPOINT
        )
        if declared > self._max_bytes:
            raise CheckpointCorruptionError(
                link.path,
                f"declares {declared} decoded bytes, over max_record_bytes={self._max_bytes}",
            )
        return header, declared, link

    def _frame(self, link: _Link, expected: codec.FrameHeader) -> tuple[codec.FrameHeader, bytes]:
        data = link.image
        if data is None:
            try:
                data = self._read_file(link.path)
            except FileNotFoundError:
                data = self._moved(link).image
                assert data is not None
        header, body = codec.unpack_frame(data, link.path, expect_kind=codec.KIND_CHECKPOINT)
        if header[:4] != expected[:4]:
            raise CheckpointCorruptionError(
                link.path, "file changed while its chain was read", moved=True
            )
        codec.check_content_size(body, link.path, self._max_bytes)
        return header, body

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

    def _base(self, seq: int, dependent: str) -> _Link | None:
        """Checkpoint ``seq`` (a delta's base), where the run's manifest says it is live.

        None if the run has no such checkpoint.
        """
        if self._names is None:
            if self._loose_from is None:
                self._loose_from = self.catalog.loose_from()
            if seq < self._loose_from:  # live in a pack; a loose copy there is garbage
                packed = self.catalog.packed(seq)
                return None if packed is None else self._in_pack(packed)
            # Guess the base's phase first: a stat per guess beats listing a huge directory.
            hint = dependent.rsplit(".", 2)[-2]
            for phase in (hint, *_PHASE_GUESSES):
                name = f"{seq:012d}.{phase}.ckpt"
                if os.path.lexists(self._dir + name):
                    return _Link(seq, name, self._dir + name, None)
                if phase == hint:  # not loose under its likely name: packed?
                    packed = self.catalog.packed(seq)
                    if packed is not None:
                        return self._in_pack(packed)
            self._names = {f.seq: f for f in self.catalog.files()}
        file = self._names.get(seq)
        return None if file is None else self._locate(seq, file.name, file.pack)

    def forget(self) -> None:
        """Forget what was listed (not the decoded cache: a seq's bytes never change)."""
        self._names = None
        self._loose_from = None

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

    Its MAC trailer, or :data:`~afk_local.storage.format.integrity.NO_MAC` when it has no sound one;
    None when the file does not exist. Reads the header and the trailer only.
    """
    try:
        fd = fsio.open_regular(path)
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
        fd = fsio.open_regular(path)
    except OSError:
        return False
    try:
        head = os.pread(fd, codec.HEADER_SIZE, 0)
        return codec.signature_offset(head, os.fstat(fd).st_size) is not None
    except OSError:
        return False
    finally:
        os.close(fd)
