"""The watcher's attempt logs of a run, read for its page: the newest, each bounded.

A watcher-started attempt writes its output to ``logs/attempt-<n>.log`` in the run's
directory (:func:`~afk_local.watcher.attempts.attempt_log`). The page shows the end
of each of the newest :data:`MAX_LOGS` of them, at most :data:`MAX_LOG_BYTES` each,
as text (the template escapes it). Only regular files are read, never through a link.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from afk_local.storage.format.layout import LOGS_NAME
from afk_local.storage.views.notebook import format_bytes, format_ms
from afk_local.watcher.attempts import attempt_log

MAX_LOGS = 10
"""Attempt logs shown on a run's page (the newest)."""
MAX_LOG_BYTES = 64 << 10
"""Bytes shown of one log: its end."""
_LOG_NAME = re.compile(r"attempt-([0-9]{1,9})\.log")


@dataclass(frozen=True)
class AttemptLog:
    """The end of one attempt's log, as the page shows it."""

    attempt: int
    path: str
    size: str
    written: str
    text: str
    cut: bool
    """True when only the end is shown (the log is larger than :data:`MAX_LOG_BYTES`)."""
    problem: str | None = None


def attempt_numbers(run_dir: Path) -> list[int]:
    """The attempts of ``run_dir`` that have a log, newest first."""
    try:
        names = os.listdir(run_dir / LOGS_NAME)
    except OSError:
        return []
    found = (_LOG_NAME.fullmatch(name) for name in names)
    return sorted((int(m.group(1)) for m in found if m), reverse=True)


def read_tail(path: Path, limit: int = MAX_LOG_BYTES) -> tuple[str, int, int, bool]:
    """The last ``limit`` bytes of the regular file ``path`` as text, its size, mtime and cut.

    Raises:
        OSError: it is missing, a link, or not a regular file.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{path} is not a regular file")
        cut = info.st_size > limit
        fh.seek(max(info.st_size - limit, 0))
        data = fh.read(limit)
    if cut:  # start at a whole line
        newline = data.find(b"\n")
        if 0 <= newline < len(data) - 1:
            data = data[newline + 1 :]
    return data.decode("utf-8", "replace"), info.st_size, int(info.st_mtime * 1000), cut


def attempt_logs(run_dir: Path, newest: int = MAX_LOGS) -> list[AttemptLog]:
    """The newest ``newest`` attempt logs of the run in ``run_dir``, newest first."""
    logs = []
    for attempt in attempt_numbers(run_dir)[:newest]:
        path = attempt_log(run_dir, attempt)
        try:
            text, size, mtime_ms, cut = read_tail(path)
        except OSError as exc:
            problem = exc.strerror or str(exc)
            logs.append(AttemptLog(attempt, str(path), "-", "-", "", False, problem))
            continue
        logs.append(
            AttemptLog(attempt, str(path), format_bytes(size), format_ms(mtime_ms), text, cut)
        )
    return logs


__all__ = [
    "MAX_LOGS",
    "MAX_LOG_BYTES",
    "AttemptLog",
    "attempt_logs",
    "attempt_numbers",
    "read_tail",
]
