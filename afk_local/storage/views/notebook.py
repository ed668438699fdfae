"""Notebook display: compact HTML tables for runs (``_repr_html_``) and shared formatting.

Jupyter calls ``_repr_html_`` on the last value of a cell: a :class:`~afk_local.RunReader`
shows the run, a chart of its metrics (inline SVG) and its recent checkpoints
(:func:`run_reader_html`); a :class:`~afk_local.RunInfo`, a ``store.runs()`` list and a
:class:`~afk_local.Store` show a table of runs with status colours and progress bars
(:func:`runs_table_html`). Every stored string (run ids, tags, metric names,
errors) is escaped. Nothing here writes, and nothing here imports the classes it
draws: they call in.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from afk_local.errors import AfkLocalError
from afk_local.storage.format.codec import RecordCodec
from afk_local.storage.format.layout import CheckpointFile, RunPaths
from afk_local.storage.format.records import Checkpoint, RunMeta
from afk_local.storage.views.run_progress import (
    format_duration,
    format_position,
    format_progress,
    progress_of,
)

RECENT_CHECKPOINTS = 8
MAX_CHART_POINTS = 400
"""Points drawn per metric; longer series are thinned evenly (the last point always stays)."""

STATUS_COLOURS = {
    "completed": "#1a7f37",
    "failed": "#cf222e",
    "cancelled": "#6e7781",
    "paused": "#9a6700",
    "running": "#0969da",
    "created": "#8250df",
}
_SPARKS = "▁▂▃▄▅▆▇█"


def _escape(text: str) -> str:
    """``html.escape``: the html module (with html.entities, large) is loaded only when a
    notebook renders a table, not by every listing that formats a size or a time."""
    import html  # noqa: PLC0415

    return html.escape(text)


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

    parts = ['<table class="afk-local">']
    if caption:
        parts.append(f"<caption>{_escape(caption)}</caption>")
    parts.append("<tr>" + "".join(f"<th>{_escape(str(h))}</th>" for h in headers) + "</tr>")
    for row in rows:
        parts.append("<tr>" + "".join(f"<td>{_escape(str(c))}</td>" for c in row) + "</tr>")
    parts.append("</table>")
    return "".join(parts)


def sparkline(values: Sequence[float], width: int = 32) -> str:
    """``values`` as a line of block characters (``▁▂▃▄▅▆▇█``), thinned to ``width``."""
    finite = [v for v in _thin(values, width) if math.isfinite(v)]
    if not finite:
        return ""
    low, high = min(finite), max(finite)
    span = high - low
    top = len(_SPARKS) - 1
    return "".join(_SPARKS[round((v - low) / span * top) if span else top // 2] for v in finite)


def _thin(values: Sequence[float], limit: int) -> list[float]:
    if len(values) <= limit:
        return list(values)
    step = (len(values) - 1) / (limit - 1)
    return [values[round(i * step)] for i in range(limit)]


@dataclass(frozen=True)
class RunRow:
    """One run as the runs table shows it (already formatted, not yet escaped)."""

    run_id: str
    status: str
    label: str
    fraction: float | None
    progress: str
    step: int | None
    """Journaled steps (None: none worth showing, see ``journaled_step``)."""
    attempt: int
    elapsed: str
    eta: str
    updated: str
    size: str
    tags: str


def runs_table_html(rows: Sequence[RunRow], caption: str = "") -> str:
    """Runs as an HTML table: status in its colour, progress as a ``<progress>`` bar."""
    headers = ("run", "status", "progress", "step", "attempts", "elapsed", "ETA", "updated")
    parts = ['<table class="afk-local afk-local-runs">']
    if caption:
        parts.append(f"<caption>{_escape(caption)}</caption>")
    parts.append("<tr>" + "".join(f"<th>{h}</th>" for h in (*headers, "size", "tags")) + "</tr>")
    for row in rows:
        colour = STATUS_COLOURS.get(row.status, "inherit")
        bar = ""
        if row.fraction is not None:
            bar = f'<progress max="100" value="{row.fraction * 100:.1f}"></progress> '
        cells = [
            f"<td>{_escape(row.run_id)}</td>",
            f'<td><span style="color:{colour};font-weight:600">{_escape(row.label)}</span></td>',
            f"<td>{bar}{_escape(row.progress)}</td>",
            *(
                f"<td>{_escape(str(v))}</td>"
                for v in (
                    "-" if row.step is None else row.step,
                    row.attempt,
                    row.elapsed,
                    row.eta,
                    row.updated,
                    row.size,
                    row.tags,
                )
            ),
        ]
        parts.append("<tr>" + "".join(cells) + "</tr>")
    if not rows:
        parts.append(f'<tr><td colspan="{len(headers) + 2}">no runs</td></tr>')
    parts.append("</table>")
    return "".join(parts)


def metrics_svg(
    series: Mapping[str, Sequence[float]], *, width: int = 300, height: int = 60
) -> str:
    """One small inline SVG line chart per metric, labelled with its last, min and max value."""
    charts = []
    for name, values in series.items():
        points = [v for v in _thin(values, MAX_CHART_POINTS) if math.isfinite(v)]
        if not points:
            continue
        low, high = min(points), max(points)
        span = (high - low) or 1.0
        n = len(points)
        coords = " ".join(
            f"{(i / (n - 1) if n > 1 else 0.5) * (width - 4) + 2:.1f},"
            f"{height - 2 - (v - low) / span * (height - 4):.1f}"
            for i, v in enumerate(points)
        )
        label = (
            f"{name}: last {values[-1]:.4g} (min {low:.4g}, max {high:.4g}, {len(values)} points)"
        )
        charts.append(
            '<figure class="afk-local-metric" style="display:inline-block;margin:4px 12px 4px 0">'
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img"><title>{_escape(name)}</title>'
            f'<rect width="{width}" height="{height}" fill="none" stroke="#d0d7de"/>'
            f'<polyline fill="none" stroke="#0969da" stroke-width="1.5" points="{coords}"/>'
            f"</svg><figcaption>{_escape(label)}</figcaption></figure>"
        )
    return f'<div class="afk-local-metrics">{"".join(charts)}</div>' if charts else ""


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

    @property
    def record_codec(self) -> RecordCodec:
        """The codec the run's files decode with."""

    def checkpoint_files(self) -> list[CheckpointFile]:
        """The run's checkpoint files, by seq."""

    def load(self, file: CheckpointFile) -> Checkpoint:
        """One checkpoint, decoded."""


def run_reader_html(reader: RunView, limit: int = RECENT_CHECKPOINTS) -> str:
    """The notebook view of a run: its meta and progress, its metrics, its newest checkpoints."""
    try:
        meta = reader.meta
    except AfkLocalError as exc:
        return html_table(("run", "problem"), [(reader.run_id, str(exc))])
    files = reader.checkpoint_files()
    rows: list[tuple[Any, ...]] = []
    newest: Checkpoint | None = None
    for file in files[-limit:]:
        size = _size(reader.paths.dir / file.name)
        try:
            record = reader.load(file)
            newest = record
            where = format_position(record.step, progress_of(record.payload)) or "-"
            rows.append((file.seq, where, file.phase, format_ms(record.timestamp_ms), size))
        except AfkLocalError as exc:
            rows.append((file.seq, "?", file.phase, f"damaged: {exc}", size))
    progress = progress_of(newest.payload) if newest is not None else None
    tags = meta.extra.get("tags") if isinstance(meta.extra, dict) else None
    head = html_table(
        ("run", "status", "attempt", "progress", "elapsed", "entrypoint", "created", "updated"),
        [
            (
                reader.run_id,
                meta.status.value,
                meta.attempt,
                format_progress(progress),
                format_duration(progress.active_ms / 1000) if progress else "-",
                meta.entrypoint or "-",
                format_ms(meta.created_ms),
                format_ms(meta.updated_ms),
            )
        ],
    )
    if isinstance(tags, dict) and tags:
        head += html_table(("tag", "value"), sorted((str(k), str(v)) for k, v in tags.items()))
    if meta.error is not None:
        head += html_table(("error", "message"), [(meta.error.type, meta.error.message)])
    try:
        from afk_local.storage.rundir.read.metrics import read_metrics  # noqa: PLC0415

        metrics = read_metrics(reader)
    except (AfkLocalError, OSError):
        metrics = None
    chart = ""
    if metrics:
        chart = metrics_svg({n: [p.value for p in metrics.series(n)] for n in metrics.names()})
    shown = f"last {len(rows)} of {len(files)} checkpoints" if files else "no checkpoints yet"
    return (
        head + chart + html_table(("seq", "where", "phase", "time", "bytes"), rows, caption=shown)
    )


def _size(path: os.PathLike[str]) -> int:
    try:
        return os.stat(path, follow_symlinks=False).st_size
    except OSError:
        return 0
