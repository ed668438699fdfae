"""``afk-local metrics RUN``: what a run recorded with ``ctx.metric``, and its trend.

A table of every metric (count, last, min, max, mean, last step) with a sparkline
on a terminal; ``--json`` adds every point. ``show`` prints the same lines
(:func:`metric_lines`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any

from afk_local.cli.command import EXIT_OK, CliError, emit_json, open_store, out, require_run
from afk_local.cli.render import print_table
from afk_local.storage.rundir.read.metrics import MetricLog
from afk_local.storage.views.notebook import sparkline


def _number(value: Any) -> str:
    return "-" if value is None else f"{value:.6g}"


def metric_lines(
    summary: Mapping[str, Mapping[str, Any]], log: MetricLog | None = None
) -> list[str]:
    """One line per metric: ``loss  last 0.2  min 0.2  max 1  (5 points, step 5)``.

    With ``log`` (the points), a sparkline of each metric ends its line.
    """
    width = max((len(name) for name in summary), default=0)
    lines = []
    for name, s in summary.items():
        line = (
            f"{name:<{width}}  last {_number(s['last'])}  min {_number(s['min'])}  "
            f"max {_number(s['max'])}  ({s['count']} points, step {s['last_step']})"
        )
        if log is not None:
            line += "  " + sparkline([p.value for p in log.series(name)])
        lines.append(line)
    return lines


def on_terminal() -> bool:
    """stdout is a terminal (sparklines are for people)."""
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


def cmd_metrics(args: argparse.Namespace) -> int:
    """``metrics RUN [--name NAME]``: every metric of a run, summarised (``--json``: points)."""
    store = open_store(args)
    require_run(store, args.run)
    log = store.open(args.run).metrics()
    if args.name is not None:
        if args.name not in log.names():
            known = ", ".join(log.names()) or "none"
            raise CliError(f"run {args.run!r} has no metric {args.name!r} (it has: {known})")
        log = MetricLog(log.series(args.name))
    summary = log.summary()
    if args.json:
        emit_json({"run_id": args.run, "summary": summary, "points": log.to_records()})
        return EXIT_OK
    if not log:
        out(f"run {args.run} recorded no metrics (ctx.metric(name, value) records them)")
        return EXIT_OK
    headers = ["METRIC", "COUNT", "LAST", "MIN", "MAX", "MEAN", "STEP"]
    rows = [
        [
            name,
            s["count"],
            _number(s["last"]),
            _number(s["min"]),
            _number(s["max"]),
            _number(s["mean"]),
            s["last_step"],
        ]
        for name, s in summary.items()
    ]
    if on_terminal():
        headers.append("TREND")
        for row, name in zip(rows, summary, strict=True):
            row.append(sparkline([p.value for p in log.series(name)]))
    print_table(headers, rows, align_right=(1, 2, 3, 4, 5, 6))
    return EXIT_OK


__all__ = ["cmd_metrics", "metric_lines", "on_terminal"]
