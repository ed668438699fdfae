"""``afk-local runs`` filters: ``--status``, ``--since``, ``--name``, ``--tag``, ``--limit``.

:func:`add_filter_arguments` declares the flags and :func:`list_runs` applies them
(:class:`~afk_local.storage.views.run_filter.RunFilter` does the deciding), so a command
that lists runs from somewhere else can take the same flags.
"""

from __future__ import annotations

import argparse

from afk_local.cli.command import CliError
from afk_local.storage.format.records import RunStatus, now_ms
from afk_local.storage.store import Store
from afk_local.storage.views.run_filter import LIVENESS, parse_since, parse_tag
from afk_local.storage.views.run_info import RunList


def _limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value}")
    return value


def add_filter_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``afk-local runs`` that choose runs."""
    p.add_argument(
        "--status",
        choices=[s.value for s in RunStatus] + list(LIVENESS),
        help="only runs with this status (interrupted: a crash left it; live: a process runs it)",
    )
    p.add_argument(
        "--since",
        metavar="AGE",
        help="only runs updated in the last AGE (30m, 2h, 3d, 1w) or since a date/time",
    )
    p.add_argument(
        "--name", metavar="GLOB", help="only runs whose id or job name matches (crawl-*)"
    )
    p.add_argument(
        "--tag",
        action="append",
        default=[],
        metavar="K=V",
        help="only runs tagged K=V (or K, any value); repeatable, all must match",
    )
    p.add_argument("--limit", type=_limit, metavar="N", help="at most N runs (the newest)")


def list_runs(store: Store, args: argparse.Namespace) -> RunList:
    """The runs of ``store`` the filter flags in ``args`` choose, newest first.

    Raises:
        CliError: a ``--since`` or ``--tag`` that does not parse (one line, exit 2).
    """
    try:
        since_ms = parse_since(args.since, now_ms()) if args.since else None
        tags = dict(parse_tag(t) for t in args.tag)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    return store.runs(args.status, since_ms=since_ms, name=args.name, tags=tags, limit=args.limit)


def describe_filters(args: argparse.Namespace) -> str:
    """`` with status failed, tagged model=small`` (empty without filters), for "no runs" lines."""
    words = []
    if args.status:
        words.append(f"status {args.status}")
    if args.since:
        words.append(f"updated since {args.since}")
    if args.name:
        words.append(f"named {args.name}")
    if args.tag:
        words.append("tagged " + " ".join(args.tag))
    return (" with " + ", ".join(words)) if words else ""


__all__ = ["add_filter_arguments", "describe_filters", "list_runs"]
