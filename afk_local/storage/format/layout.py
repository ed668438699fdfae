"""Names and paths inside a store (docs/format.md), and the validation that guards them.

Nothing here touches the disk except :func:`scan_checkpoints`. Every run id is
validated before a path is built from it.
"""

from __future__ import annotations

import enum
import functools
import os
import re
import time
from pathlib import Path

import msgspec

from afk_local.errors import InvalidRunIdError

RUN_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z"
"""What a run id is (for ``re.search``; ``.``, ``..``, ``/`` and NUL never match)."""
_RUN_ID = re.compile(RUN_ID_PATTERN)
_PHASE = re.compile(r"[a-z][a-z0-9_]{0,31}")
_CHECKPOINT_NAME = re.compile(r"(\d{12})\.([a-z][a-z0-9_]{0,31})\.ckpt")
ENTRYPOINT = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")
"""What a valid entrypoint looks like: ``package.module:Qual.name``."""
_PACK_NAME = re.compile(r"pack-(\d{12})-(\d{12})-([0-9a-f]{8})\.pack")

META_NAME = "run.meta"
LOCK_NAME = "owner.lock"
LATEST_NAME = "latest"
JOURNAL_NAME = "effects.log"
MANIFEST_NAME = "MANIFEST"
"""Which packs and which loose range of a run are live (format/manifest.py)."""
LOGS_NAME = "logs"
RUNS_DIR = "runs"
REQUESTS_DIR = "requests"
MAX_SEQ = 10**12 - 1
DEFAULT_LOOSE_LIMIT = 256
"""Loose checkpoint files a writer lets accumulate before it packs the older ones
(:mod:`~afk_local.storage.rundir.packing`; here so that opening a store does not import it)."""


def validate_run_id(run_id: object) -> str:
    """Return ``run_id`` if it is a valid run id, else raise :class:`InvalidRunIdError`."""
    if not isinstance(run_id, str) or _RUN_ID.fullmatch(run_id) is None:
        raise InvalidRunIdError(run_id)
    if run_id in (".", ".."):  # unreachable with the pattern, kept as a guard
        raise InvalidRunIdError(run_id)
    return run_id


# Phases already checked, names and Phase members alike, to the name (a run uses a
# handful; every checkpoint asks).
_valid_phases: dict[object, str] = {}


def validate_phase(phase: object) -> str:
    """Return ``phase`` if it can be part of a checkpoint file name, else raise ValueError."""
    cacheable = type(phase) is str or isinstance(phase, enum.Enum)
    if cacheable:
        known = _valid_phases.get(phase)
        if known is not None:
            return known
    text = str(phase.value if hasattr(phase, "value") else phase)
    if _PHASE.fullmatch(text) is None:
        raise ValueError(f"invalid phase {phase!r}: use 1-32 of a-z 0-9 _, starting with a letter")
    if cacheable and len(_valid_phases) < 1024:
        _valid_phases[phase] = text
    return text


def checkpoint_name(seq: int, phase: str) -> str:
    """The file name of checkpoint ``seq``: ``<seq:012d>.<phase>.ckpt``."""
    if not 1 <= seq <= MAX_SEQ:
        raise ValueError(f"seq {seq} out of range")
    return f"{seq:012d}.{phase}.ckpt"


@functools.total_ordering
class CheckpointFile:
    """A checkpoint of a run directory (name parsed, content not read).

    Usually a file of its own (loose); a checkpoint folded into a pack keeps its name,
    and :attr:`pack` names the pack file that holds its bytes. Immutable; compared,
    ordered and hashed by ``(seq, phase, name)``: where its bytes are is not part of
    which checkpoint it is.
    """

    # A plain class rather than a dataclass: defining a dataclass compiles its methods
    # at import (~1 ms each on a small VM), and every reader imports this module.
    __slots__ = ("name", "pack", "phase", "seq")

    seq: int
    phase: str
    name: str
    pack: str | None
    """The pack file holding this checkpoint, None for a loose file (see storage/pack.py)."""

    def __init__(self, seq: int, phase: str, name: str, pack: str | None = None) -> None:
        object.__setattr__(self, "seq", seq)
        object.__setattr__(self, "phase", phase)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "pack", pack)

    def _key(self) -> tuple[int, str, str]:
        return (self.seq, self.phase, self.name)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"CheckpointFile is immutable: cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"CheckpointFile is immutable: cannot delete {name!r}")

    def __repr__(self) -> str:
        return (
            f"CheckpointFile(seq={self.seq!r}, phase={self.phase!r}, name={self.name!r}, "
            f"pack={self.pack!r})"
        )

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __lt__(self, other: CheckpointFile) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._key() < other._key()

    def __reduce__(self) -> tuple[type[CheckpointFile], tuple[int, str, str, str | None]]:
        return (CheckpointFile, (self.seq, self.phase, self.name, self.pack))


def parse_checkpoint_name(name: str) -> CheckpointFile | None:
    """Parse ``<seq>.<phase>.ckpt``; None for any other name (temp files, latest, ...)."""
    match = _CHECKPOINT_NAME.fullmatch(name)
    if match is None:
        return None
    seq = int(match.group(1))
    if seq < 1:
        return None
    return CheckpointFile(seq, match.group(2), name)


class PackFile(msgspec.Struct, frozen=True, order=True):
    """A pack file found in a run directory: the seq range its name claims (not checked)."""

    first: int
    last: int
    name: str


def pack_name(first: int, last: int, digest: str) -> str:
    """The file name of a pack holding checkpoints ``first`` .. ``last``:
    ``pack-<first:012d>-<last:012d>-<8 hex digits of its content's SHA-256>.pack``."""
    if not 1 <= first <= last <= MAX_SEQ:
        raise ValueError(f"pack range {first}..{last} out of range")
    return f"pack-{first:012d}-{last:012d}-{digest[:8]}.pack"


def parse_pack_name(name: str) -> PackFile | None:
    """Parse a pack file name; None for any other name."""
    match = _PACK_NAME.fullmatch(name)
    if match is None:
        return None
    first, last = int(match.group(1)), int(match.group(2))
    if not 1 <= first <= last:
        return None
    return PackFile(first, last, name)


def scan_run_files(
    run_dir: str | os.PathLike[str],
) -> tuple[list[CheckpointFile], list[PackFile]]:
    """The loose checkpoint files and the pack files of a run, each in order (one listing)."""
    loose: list[CheckpointFile] = []
    packs: list[PackFile] = []
    with os.scandir(run_dir) as entries:
        for entry in entries:
            name = entry.name
            if name.endswith(".ckpt"):
                parsed = parse_checkpoint_name(name)
                if parsed is not None and entry.is_file(follow_symlinks=False):
                    loose.append(parsed)
            elif name.endswith(".pack"):
                pack = parse_pack_name(name)
                if pack is not None and entry.is_file(follow_symlinks=False):
                    packs.append(pack)
    loose.sort()
    packs.sort()
    return loose, packs


def scan_checkpoints(run_dir: str | os.PathLike[str]) -> list[CheckpointFile]:
    """Every loose checkpoint file of a run, in seq order (one directory listing).

    Packed checkpoints are not listed: :class:`~afk_local.storage.rundir.read.catalog.RunCatalog`
    lists both.
    """
    found = []
    with os.scandir(run_dir) as entries:
        for entry in entries:
            parsed = parse_checkpoint_name(entry.name)
            if parsed is not None and entry.is_file(follow_symlinks=False):
                found.append(parsed)
    found.sort()
    return found


class RunPaths(msgspec.Struct, frozen=True):
    """The files of one run directory."""

    run_id: str
    dir: Path

    @property
    def meta(self) -> Path:
        """``run.meta``."""
        return self.dir / META_NAME

    @property
    def lock(self) -> Path:
        """``owner.lock``."""
        return self.dir / LOCK_NAME

    @property
    def latest(self) -> Path:
        """The ``latest`` symlink (or pointer file)."""
        return self.dir / LATEST_NAME

    @property
    def journal(self) -> Path:
        """``effects.log``."""
        return self.dir / JOURNAL_NAME

    @property
    def manifest(self) -> Path:
        """``MANIFEST``: the live packs and loose range (written by rewrites only)."""
        return self.dir / MANIFEST_NAME

    @property
    def logs(self) -> Path:
        """``logs/``: output of watcher-started attempts."""
        return self.dir / LOGS_NAME

    def checkpoint(self, seq: int, phase: str) -> Path:
        """The path of checkpoint ``seq`` written at ``phase``."""
        return self.dir / checkpoint_name(seq, phase)


def new_run_id() -> str:
    """A fresh, sortable run id: ``YYYYmmdd-HHMMSS-<8 hex>``."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + os.urandom(4).hex()
