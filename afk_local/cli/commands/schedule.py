"""``afk-local schedule add|list|rm``: jobs the watcher starts on a schedule (docs/time.md).

``add`` imports the job first (from the working directory too, as ``submit`` does),
so a typo fails now rather than in the watcher, and records where it was added from,
so every run starts from there.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import sys
from typing import Any

from afk_local.cli.command import EXIT_OK, CliError, emit_json, open_store, out
from afk_local.cli.commands.watch import _parse_args_json as parse_args_json
from afk_local.cli.render import print_table
from afk_local.clock import current_clock
from afk_local.errors import EntrypointError
from afk_local.runner.code.entrypoints import is_entrypoint
from afk_local.runner.code.origin import origin_here
from afk_local.runner.operations.resume import load_entrypoint
from afk_local.storage.views.run_filter import parse_duration
from afk_local.watcher.schedules import (
    Schedule,
    last_started_slot,
    list_schedules,
    remove_schedule,
    schedule_path,
    write_schedule,
)
from afk_local.watcher.slots import CATCHUP, OVERLAP


def add_schedule_arguments(p: argparse.ArgumentParser, reading: argparse.ArgumentParser) -> None:
    """The sub-commands of ``afk-local schedule`` (``reading``: the ``--root``/``--json`` flags)."""
    sub = p.add_subparsers(dest="schedule_command", metavar="add|list|rm")

    add = sub.add_parser(
        "add", parents=[reading], help="add (or replace) a schedule", description=_ADD_HELP
    )
    add.set_defaults(handler=cmd_schedule_add)
    add.add_argument("name", metavar="NAME", help="the schedule's name (its runs: NAME--SLOT)")
    add.add_argument("entrypoint", metavar="MODULE:FUNCTION", help="an @afk.durable job")
    add.add_argument(
        "job_args", metavar="ARGS", nargs="?", help="JSON: a list (positional) or an object"
    )
    when = add.add_mutually_exclusive_group(required=True)
    when.add_argument("--every", metavar="DURATION", help="e.g. 30s, 15m, 1h, 1d (whole seconds)")
    when.add_argument("--cron", metavar="EXPR", help="a cron expression, e.g. '0 3 * * *'")
    add.add_argument(
        "--catchup",
        choices=CATCHUP,
        default="latest",
        help="slots missed while no watcher ran: the newest one (latest, default), "
        "all of them, or none (skip)",
    )
    add.add_argument(
        "--overlap",
        choices=OVERLAP,
        default="allow",
        help="a slot due while the previous run is unfinished: start it anyway (allow, "
        "default), skip it, or queue it until that run ended",
    )
    add.add_argument(
        "--timezone", metavar="TZ", default="", help="IANA zone for --cron (default: local)"
    )

    listing = sub.add_parser("list", parents=[reading], help="the schedules and their last runs")
    listing.set_defaults(handler=cmd_schedule_list)
    remove = sub.add_parser("rm", parents=[reading], help="remove a schedule (its runs stay)")
    remove.set_defaults(handler=cmd_schedule_rm)
    remove.add_argument("name", metavar="NAME")


_ADD_HELP = (
    "Add a schedule: the watcher (`afk-local watch`) starts one run of the job per slot, "
    "with the run id NAME--YYYYmmddTHHMMSSZ, created create-only so no slot runs twice."
)


def cmd_schedule(args: argparse.Namespace) -> int:
    """``schedule`` without a sub-command: say which there are (exit 2)."""
    raise CliError("name a sub-command: add, list or rm (`afk-local schedule --help`)")


def _every_seconds(text: str) -> int:
    seconds = parse_duration(text)
    if seconds is None or seconds < 1 or seconds != int(seconds):
        raise CliError(f"--every takes whole seconds like 30s, 15m, 2h, 1d (>= 1s), not {text!r}")
    return int(seconds)


def cmd_schedule_add(args: argparse.Namespace) -> int:
    """``schedule add NAME MODULE:FUNCTION [ARGS] (--every D | --cron EXPR)``."""
    try:
        positional, keywords = parse_args_json(args.job_args)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if not is_entrypoint(args.entrypoint) or args.entrypoint.startswith("__main__:"):
        raise CliError(
            f"{args.entrypoint!r} is not module:function (e.g. mypkg.jobs:report): name an "
            "@afk.durable job in an importable module"
        )
    store = open_store(args, create=True)
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        job = load_entrypoint(args.entrypoint, f"(schedule {args.name})")
    except EntrypointError as exc:  # no run exists yet: nothing to resume or cancel
        found = re.split(r": (?:install|put it back|then)", exc.reason)[0]
        raise CliError(
            f"schedule {args.name} not added: {args.entrypoint!r} cannot be loaded here "
            f"({found}); name an @afk.durable job in a module importable from this directory "
            "or on PYTHONPATH"
        ) from None
    schedule = Schedule(
        name=args.name,
        entrypoint=args.entrypoint,
        args=positional,
        kwargs=keywords,
        every_s=_every_seconds(args.every) if args.every else 0,
        cron=args.cron or "",
        timezone=args.timezone,
        catchup=args.catchup,
        overlap=args.overlap,
        origin=origin_here(job.fn),
    )
    try:
        path = write_schedule(store, schedule)
    except (ValueError, ImportError) as exc:
        raise CliError(str(exc)) from None
    if args.json:
        emit_json({"name": args.name, "path": str(path), **_facts(store, schedule)})
    else:
        out(f"schedule {args.name} added: {_when(schedule)}; `afk-local watch` starts its runs")
    return EXIT_OK


def _when(schedule: Schedule) -> str:
    overlap = f", overlap {schedule.overlap}" if schedule.overlap != "allow" else ""
    if schedule.every_s:
        return f"every {schedule.every_s}s, catchup {schedule.catchup}{overlap}"
    zone = f" ({schedule.timezone})" if schedule.timezone else ""
    return f"cron '{schedule.cron}'{zone}, catchup {schedule.catchup}{overlap}"


def _facts(store: Any, schedule: Schedule) -> dict[str, Any]:
    try:
        newest = last_started_slot(store, schedule.name, schedule.created_ms)
    except ValueError:
        newest = None
    now = current_clock().time()
    try:
        latest = schedule.timing.latest(now)
        upcoming = latest + schedule.timing.period(latest)
    except (ValueError, ImportError):
        upcoming = None
    return {
        "entrypoint": schedule.entrypoint,
        "every_s": schedule.every_s or None,
        "cron": schedule.cron or None,
        "timezone": schedule.timezone or None,
        "catchup": schedule.catchup,
        "overlap": schedule.overlap,
        "last_run": None if newest is None else schedule.run_id(newest),
        "next_slot": _iso(upcoming),
    }


def _iso(when: float | None) -> str | None:
    if when is None:
        return None
    return dt.datetime.fromtimestamp(when).astimezone().isoformat(timespec="seconds")


def cmd_schedule_list(args: argparse.Namespace) -> int:
    """``schedule list``: every schedule, its timing, its last run and next slot."""
    store = open_store(args)
    rows: list[dict[str, Any]] = []
    for path, schedule in list_schedules(store):
        if isinstance(schedule, str):
            rows.append({"name": path.stem, "problem": schedule})
        else:
            rows.append({"name": schedule.name, **_facts(store, schedule), "problem": None})
    if args.json:
        emit_json(rows)
        return EXIT_OK
    if not rows:
        out(
            "no schedules (add one with `afk-local schedule add NAME MODULE:FUNCTION --every "
            "1h`; `afk-local schedule add --help` shows every option)"
        )
        return EXIT_OK
    table = [
        [
            r["name"],
            r.get("entrypoint") or "-",
            r["problem"] or _when_row(r),
            r.get("last_run") or "-",
            r.get("next_slot") or "-",
        ]
        for r in rows
    ]
    print_table(["NAME", "JOB", "WHEN", "LAST RUN", "NEXT SLOT"], table)
    return EXIT_OK


def _when_row(row: dict[str, Any]) -> str:
    if row.get("every_s"):
        return f"every {row['every_s']}s ({row['catchup']})"
    zone = f" {row['timezone']}" if row.get("timezone") else ""
    return f"cron '{row['cron']}'{zone} ({row['catchup']})"


def cmd_schedule_rm(args: argparse.Namespace) -> int:
    """``schedule rm NAME``: no more runs from it (the runs it made stay)."""
    store = open_store(args)
    try:
        schedule_path(store, args.name)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if not remove_schedule(store, args.name):
        raise CliError(f"no schedule {args.name!r} (`afk-local schedule list` shows them)")
    if args.json:
        emit_json({"name": args.name, "removed": True})
    else:
        out(f"schedule {args.name} removed; its runs stay")
    return EXIT_OK


__all__ = [
    "add_schedule_arguments",
    "cmd_schedule",
    "cmd_schedule_add",
    "cmd_schedule_list",
    "cmd_schedule_rm",
]
