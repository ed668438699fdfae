"""Names and paths inside a store (docs/format.md), and the validation that guards them.

Nothing here touches the disk except :func:`scan_checkpoints`. Every run id is
validated before a path is built from it.
"""

from __future__ import annotations

import os
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from afk_local.errors import InvalidRunIdError

_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_PHASE = re.compile(r"[a-z][a-z0-9_]{0,31}")
_CHECKPOINT_NAME = re.compile(r"(\d{12})\.([a-z][a-z0-9_]{0,31})\.ckpt")
ENTRYPOINT = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")
"""What a valid entrypoint looks like: ``package.module:Qual.name``."""

META_NAME = "run.meta"
LOCK_NAME = "owner.lock"
LATEST_NAME = "latest"
JOURNAL_NAME = "effects.log"
LOGS_NAME = "logs"
RUNS_DIR = "runs"
REQUESTS_DIR = "requests"
MAX_SEQ = 10**12 - 1


def validate_run_id(run_id: object) -> str:
    """Return ``run_id`` if it is a valid run id, else raise :class:`InvalidRunIdError`."""
    if not isinstance(run_id, str) or _RUN_ID.fullmatch(run_id) is None:
        raise InvalidRunIdError(run_id)
    if run_id in (".", ".."):  # unreachable with the pattern, kept as a guard
        raise InvalidRunIdError(run_id)
    return run_id


def validate_phase(phase: object) -> str:
    """Return ``phase`` if it can be part of a checkpoint file name, else raise ValueError."""
    text = str(phase.value if hasattr(phase, "value") else phase)
    if _PHASE.fullmatch(text) is None:
        raise ValueError(f"invalid phase {phase!r}: use 1-32 of a-z 0-9 _, starting with a letter")
    return text


def checkpoint_name(seq: int, phase: str) -> str:
    """The file name of checkpoint ``seq``: ``<seq:012d>.<phase>.ckpt``."""
    if not 1 <= seq <= MAX_SEQ:
        raise ValueError(f"seq {seq} out of range")
    return f"{seq:012d}.{phase}.ckpt"


@dataclass(frozen=True, order=True)
class CheckpointFile:
    """A checkpoint file found in a run directory (name parsed, content not read)."""

    seq: int
    phase: str
    name: str


def parse_checkpoint_name(name: str) -> CheckpointFile | None:
    """Parse ``<seq>.<phase>.ckpt``; None for any other name (temp files, latest, ...)."""
    match = _CHECKPOINT_NAME.fullmatch(name)
    if match is None:
        return None
    seq = int(match.group(1))
    if seq < 1:
        return None
    return CheckpointFile(seq, match.group(2), name)


def scan_checkpoints(run_dir: str | os.PathLike[str]) -> list[CheckpointFile]:
    """Every checkpoint file of a run, in seq order (one directory listing)."""
    found = []
    with os.scandir(run_dir) as entries:
        for entry in entries:
            parsed = parse_checkpoint_name(entry.name)
            if parsed is not None and entry.is_file(follow_symlinks=False):
                found.append(parsed)
    found.sort()
    return found


@dataclass(frozen=True)
class RunPaths:
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
    def logs(self) -> Path:
        """``logs/``: output of watcher-started attempts."""
        return self.dir / LOGS_NAME

    def checkpoint(self, seq: int, phase: str) -> Path:
        """The path of checkpoint ``seq`` written at ``phase``."""
        return self.dir / checkpoint_name(seq, phase)


def new_run_id() -> str:
    """A fresh, sortable run id: ``YYYYmmdd-HHMMSS-<8 hex>``."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(4)
