"""Metric charts drawn on the server as SVG: readable without JavaScript, nothing to ship.

One line chart per metric (``ctx.metric(name, value)``), x the run's logical step,
y the value, with its range written out, a ``<title>`` for screen readers and the
points as ``<title>``-labelled circles when there are few of them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

from afk_local.storage.rundir.read.metrics import MetricPoint

WIDTH = 480
HEIGHT = 160
PAD = 32
MAX_POINTS = 2000
"""Points drawn per chart; a longer series is thinned evenly (first and last kept)."""
DOT_LIMIT = 60
"""Series this short show a dot (with its value as a tooltip) at each point."""


def _thin(points: Sequence[MetricPoint]) -> list[MetricPoint]:
    if len(points) <= MAX_POINTS:
        return list(points)
    stride = (len(points) - 1) / (MAX_POINTS - 1)
    return [points[round(i * stride)] for i in range(MAX_POINTS)]


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def line_chart(name: str, points: Sequence[MetricPoint]) -> str:
    """An SVG line chart of one metric's ``points`` (an empty note when none is finite)."""
    usable = [p for p in _thin(points) if math.isfinite(p.value)]
    label = escape(name)
    if not usable:
        return f'<p class="muted">{label}: no finite values to draw</p>'
    xs = [float(p.step) for p in usable]
    ys = [p.value for p in usable]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    xspan = (x1 - x0) or 1.0
    yspan = (y1 - y0) or 1.0

    def at(x: float, y: float) -> tuple[float, float]:
        return (
            PAD + (x - x0) / xspan * (WIDTH - 2 * PAD),
            HEIGHT - PAD - (y - y0) / yspan * (HEIGHT - 2 * PAD),
        )

    coords = [at(x, y) for x, y in zip(xs, ys, strict=True)]
    line = " ".join(f"{cx:.1f},{cy:.1f}" for cx, cy in coords)
    summary = (
        f"{label}: {len(points)} points, steps {_fmt(x0)} to {_fmt(x1)}, "
        f"values {_fmt(y0)} to {_fmt(y1)}, last {_fmt(ys[-1])}"
    )
    dots = ""
    if len(usable) <= DOT_LIMIT:
        dots = "".join(
            f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="2.5"><title>step {p.step}: '
            f"{_fmt(p.value)}</title></circle>"
            for (cx, cy), p in zip(coords, usable, strict=True)
        )
    bottom, right = HEIGHT - PAD, WIDTH - PAD
    return (
        f'<figure class="chart"><svg role="img" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'width="100%" preserveAspectRatio="xMidYMid meet" aria-label="{summary}">'
        f"<title>{summary}</title>"
        f'<line class="axis" x1="{PAD}" y1="{bottom}" x2="{right}" y2="{bottom}"/>'
        f'<line class="axis" x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{bottom}"/>'
        f'<text x="{PAD - 4}" y="{PAD + 4}" text-anchor="end">{_fmt(y1)}</text>'
        f'<text x="{PAD - 4}" y="{bottom}" text-anchor="end">{_fmt(y0)}</text>'
        f'<text x="{PAD}" y="{HEIGHT - 8}">{_fmt(x0)}</text>'
        f'<text x="{right}" y="{HEIGHT - 8}" text-anchor="end">step {_fmt(x1)}</text>'
        f'<polyline fill="none" points="{line}"/>{dots}</svg>'
        f"<figcaption>{summary}</figcaption></figure>"
    )


__all__ = ["line_chart"]
