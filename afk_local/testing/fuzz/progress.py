"""A fuzzing run that outlives its process: one line per finished program in a file.

``python -m afk_local.testing.fuzz --torture --progress FILE`` appends, after each
program, a JSON line with its index, seed, outcome and seconds (written, flushed and
fsynced before the next program starts). Started again with the same file and the same
settings, the run plays only the programs the file does not hold yet, in order: a run
stopped anywhere (SIGKILL, session end, reboot) goes on where it stopped, replaying
at most the one program it was in the middle of (never recorded), skipping none.

The file's first line holds the run's settings; a second start with other settings is
refused, so one file never mixes two runs. A torn last line (the process died while
writing it) is dropped and its program played again.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec

MAX_PROGRESS_BYTES = 64 * 1024 * 1024
"""A progress file larger than this is refused (10,000 programs take about 1 MB)."""

OUTCOMES = ("passed", "diverged")
"""What a program's line may say."""


class Settings(msgspec.Struct, forbid_unknown_fields=True):
    """The first line of a progress file: what the run plays."""

    seed: str
    programs: int
    size: int
    kill_every: int
    keyed_every: int
    clock_steps: bool
    mutant: str | None = None


class Played(msgspec.Struct, forbid_unknown_fields=True):
    """One finished program: a line of a progress file."""

    index: int
    seed: str
    outcome: str
    seconds: float
    problems: list[str] = []
    """The divergences (shrunk), when it diverged."""
    replay: str = ""
    """The arguments that replay it, when it diverged."""


class ProgressError(ValueError):
    """The progress file cannot be continued (other settings, or not a progress file)."""


@dataclass(frozen=True)
class Summary:
    """What a progress file says was played."""

    settings: Settings
    played: int
    diverged: list[Played]
    seconds: float

    def text(self) -> str:
        """One paragraph a person reads."""
        rate = self.seconds / self.played if self.played else 0.0
        return (
            f"seed {self.settings.seed}: {self.played} of {self.settings.programs} programs "
            f"played, {len(self.diverged)} diverged; {self.seconds:.0f} s of programs, "
            f"{rate:.2f} s a program"
        )


class ProgressFile:
    """The progress file at ``path`` for a run with ``settings`` (created if missing)."""

    def __init__(self, path: str | os.PathLike[str], settings: Settings) -> None:
        self.path = Path(path)
        self.settings = settings
        self.played: dict[int, Played] = {}
        if self.path.exists() and b"\n" in self.path.read_bytes()[:4096]:
            self._load()
        else:  # new, or torn while its settings line was written
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            self.path.unlink(missing_ok=True)
            self._append(msgspec.json.encode(settings))

    def _load(self) -> None:
        size = self.path.stat().st_size
        if size > MAX_PROGRESS_BYTES:
            raise ProgressError(f"{self.path}: {size} bytes, more than a progress file holds")
        data = self.path.read_bytes()
        lines = data.split(b"\n")
        complete, torn = lines[:-1], lines[-1]
        try:
            found = msgspec.json.decode(complete[0], type=Settings)
        except msgspec.ValidationError as exc:
            raise ProgressError(f"{self.path}: not a fuzzer progress file: {exc}") from None
        if found != self.settings:
            raise ProgressError(
                f"{self.path} holds another run ({found}); give a new file, or the same "
                "settings to continue it"
            )
        for number, line in enumerate(complete[1:], start=2):
            try:
                played = msgspec.json.decode(line, type=Played)
            except msgspec.DecodeError as exc:
                raise ProgressError(f"{self.path}, line {number}: {exc}") from None
            if played.outcome not in OUTCOMES or not 0 <= played.index < self.settings.programs:
                raise ProgressError(f"{self.path}, line {number}: not a program of this run")
            self.played[played.index] = played
        if torn:  # died while writing that line: its program is played again
            with open(self.path, "r+b") as file:
                file.truncate(len(data) - len(torn))
                os.fsync(file.fileno())

    def todo(self) -> Iterator[int]:
        """The indexes not played yet, in order."""
        return (i for i in range(self.settings.programs) if i not in self.played)

    def record(self, played: Played) -> None:
        """Append ``played`` durably (fsynced before this returns)."""
        self._append(msgspec.json.encode(played))
        self.played[played.index] = played

    def _append(self, line: bytes) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)

    def summary(self) -> Summary:
        """What was played so far."""
        played = sorted(self.played.values(), key=lambda p: p.index)
        return Summary(
            self.settings,
            len(played),
            [p for p in played if p.outcome == "diverged"],
            sum(p.seconds for p in played),
        )


__all__ = [
    "MAX_PROGRESS_BYTES",
    "OUTCOMES",
    "Played",
    "ProgressError",
    "ProgressFile",
    "Settings",
    "Summary",
]
