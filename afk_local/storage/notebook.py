"""Notebook display: compact HTML tables for runs (``_repr_html_``) and shared formatting.

Jupyter calls ``_repr_html_`` on the last value of a cell: a :class:`~afk_local.RunReader`
shows the run and its recent checkpoints (:func:`run_reader_html`), a
:class:`~afk_local.RunInfo` one row. Nothing here writes, and nothing here imports
the classes it draws: they call in.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any, Protocol

from afk_local.errors import AfkLocalError
from afk_local.storage.layout import CheckpointFile, RunPaths
from afk_local.storage.records import Checkpoint, RunMeta

RECENT_CHECKPOINTS = 8


def format_ms(ms: int | None) -> str:
    """A wall-clock millisecond stamp as local ``YYYY-mm-dd HH:MM:SS`` ('-' for none)."""
    if not ms:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


def format_bytes(size: int) -> str:
    """``1234567`` -> ``1.2 MB`` (decimal units, as ``ls -h --si``)."""
    value = float(size)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} GB"  # pragma: no cover - loop always returns


def html_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], caption: str = "") -> str:
    """A small escaped HTML table."""
    import html  # noqa: PLC0415 - only notebooks render HTML; html.entities is large

    parts = ['<table class="afk-local">']
    if caption:
        parts.append(f"<caption>{html.escape(caption)}</caption>")
    parts.append("<tr>" + "".join(f"<th>{html.escape(str(h))}</th>" for h in headers) + "</tr>")
    for row in rows:
        parts.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>")
    parts.append("</table>")
    return "".join(parts)


class RunView(Protocol):
    """What the notebook view of a run reads (a :class:`~afk_local.RunReader` is one)."""

    @property
    def run_id(self) -> str:
        """The run's id."""

    @property
    def paths(self) -> RunPaths:
        """Where the run's files are."""

    @property
    def meta(self) -> RunMeta:
        """The run's ``run.meta``."""

    def checkpoint_files(self) -> list[CheckpointFile]:
        """The run's checkpoint files, by seq."""

    def load(self, file: CheckpointFile) -> Checkpoint:
        """One checkpoint, decoded."""


def run_reader_html(reader: RunView, limit: int = RECENT_CHECKPOINTS) -> str:
    """The notebook view of a run: its meta, then its newest ``limit`` checkpoints."""
    try:
        meta = reader.meta
    except AfkLocalError as exc:
        return html_table(("run", "problem"), [(reader.run_id, str(exc))])
    head = html_table(
        ("run", "status", "attempt", "entrypoint", "created", "updated"),
        [
            (
                reader.run_id,
                meta.status.value,
                meta.attempt,
                meta.entrypoint or "-",
                format_ms(meta.created_ms),
                format_ms(meta.updated_ms),
            )
        ],
    )
    files = reader.checkpoint_files()
    rows: list[tuple[Any, ...]] = []
    for file in files[-limit:]:
        size = _size(reader.paths.dir / file.name)
        try:
            record = reader.load(file)
            rows.append((file.seq, record.step, file.phase, format_ms(record.timestamp_ms), size))
        except AfkLocalError as exc:
            rows.append((file.seq, "?", file.phase, f"damaged: {exc}", size))
    shown = f"last {len(rows)} of {len(files)} checkpoints" if files else "no checkpoints yet"
    return head + html_table(("seq", "step", "phase", "time", "bytes"), rows, caption=shown)


def _size(path: os.PathLike[str]) -> int:
    try:
        return os.stat(path, follow_symlinks=False).st_size
    except OSError:
        return 0
