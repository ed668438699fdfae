"""The commands that put things right after something happened outside a run: settle, adopt.

``settle`` records what a person found out about an effect a crash left in doubt
(or takes a settlement back with ``--undo``); ``adopt`` makes a copied or moved
store's new directory its home, so its runs may be resumed there.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from afk_local.cli.command import (
    EXIT_OK,
    CliError,
    emit_json,
    open_store,
    out,
    require_run,
    suggest,
)
from afk_local.cli.commands.write import parse_json_option
from afk_local.runner.operations.adopt import adopt_store
from afk_local.runner.operations.settle import settle, unsettle

MAX_RESULT_FILE_BYTES = 64 << 20
"""The largest ``--result-file`` read."""


def add_settle_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``settle``."""
    p.add_argument("run", metavar="RUN")
    p.add_argument("key", metavar="KEY", help="the effect's key (`afk-local effects RUN`)")
    outcome = p.add_mutually_exclusive_group(required=True)
    outcome.add_argument(
        "--done",
        action="store_true",
        help="it happened: a resume replays it with --result, never calls it",
    )
    outcome.add_argument(
        "--failed", metavar="MESSAGE", help="it did not happen: a resume calls it again"
    )
    outcome.add_argument(
        "--undo",
        action="store_true",
        help="take back a settlement no resume has used yet: the effect is in doubt again",
    )
    given = p.add_mutually_exclusive_group()
    given.add_argument(
        "--result", metavar="JSON", help="with --done: what the call returned (`null` if nothing)"
    )
    given.add_argument(
        "--result-file", metavar="PATH", help="with --done: the result as a JSON file"
    )


def _result(args: argparse.Namespace) -> Any:
    if args.result is not None:
        return parse_json_option("--result", args.result)
    path = Path(args.result_file)
    try:
        with path.open("rb") as f:
            data = f.read(MAX_RESULT_FILE_BYTES + 1)
    except OSError as exc:
        raise CliError(f"--result-file {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_RESULT_FILE_BYTES:
        raise CliError(f"--result-file {path} is over {MAX_RESULT_FILE_BYTES} bytes")
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CliError(f"--result-file {path} is not valid JSON ({exc})") from None


def cmd_settle(args: argparse.Namespace) -> int:
    """``settle RUN KEY --done --result JSON | --failed MESSAGE | --undo``: an in-doubt outcome."""
    has_result = args.result is not None or args.result_file is not None
    if has_result and not args.done:
        raise CliError("--result goes with --done (the result the call returned)")
    if args.done and not has_result:
        raise CliError(
            f"run {args.run!r}: --done needs what the call returned, which the resume "
            "replays: "
            f"`{suggest(args, 'settle', args.run, args.key, '--done', '--result', 'JSON')}` "
            "(`--result null` when it returned nothing, or --result-file PATH)"
        )
    store = open_store(args)
    require_run(store, args.run)
    if args.undo:
        unsettle(args.run, args.key, store=store)
        if args.json:
            emit_json({"run_id": args.run, "key": args.key, "settled": None, "in_doubt": True})
            return EXIT_OK
        out(f"run {args.run}: settlement of effect {args.key} undone; it is in doubt again")
        again = suggest(args, "settle", args.run, args.key, "--done", "--result", "JSON")
        out(f"settle it again: {again}")
        return EXIT_OK
    result = _result(args) if args.done else None
    if args.done:
        effect = settle(args.run, args.key, store=store, done=True, result=result)
    else:
        effect = settle(args.run, args.key, store=store, done=False, message=args.failed)
    outcome = "done" if args.done else "failed"
    if args.json:
        emit_json(
            {
                "run_id": args.run,
                "key": args.key,
                "settled": outcome,
                "result": effect.result,
                "error": effect.error,
            }
        )
        return EXIT_OK
    if args.done:
        out(f"run {args.run}: effect {args.key} settled as done; a resume replays it")
    else:
        out(f"run {args.run}: effect {args.key} settled as failed; a resume calls it again")
    out(f"a mistake? before resuming: {suggest(args, 'settle', args.run, args.key, '--undo')}")
    out(f"continue the run with: {suggest(args, 'resume', args.run)}")
    return EXIT_OK


def cmd_adopt(args: argparse.Namespace) -> int:
    """``adopt``: make the directory a copied or moved store is in now its home."""
    store = open_store(args)
    project_moved = args.project_moved
    moved_from = store.moved_from()
    if project_moved is None and moved_from is not None:  # the one question adopt asks
        project_moved = _ask_project_moved(moved_from, str(store.root))
    report = adopt_store(store, project_moved=bool(project_moved))
    if args.json:
        emit_json(
            {
                "root": report.root,
                "moved_from": report.moved_from,
                "project_moved": report.project_moved,
                "rehomed": report.rehomed,
                "skipped": report.skipped,
            }
        )
        return EXIT_OK
    if report.moved_from is None:
        out(f"store {report.root} is at home already; nothing to adopt")
        return EXIT_OK
    out(f"store {report.root} adopted (it was at {report.moved_from})")
    if not report.project_moved:
        out(
            "the runs keep the scripts and working directories they recorded (the project "
            "stayed); if the scripts moved too: "
            f"{suggest(args, 'adopt', '--project-moved')}"
        )
    if report.rehomed:
        out(f"{len(report.rehomed)} run(s) now continue from here: {', '.join(report.rehomed)}")
    for run_id, why in report.skipped.items():
        out(f"run {run_id} left as it was: {why}")
    return EXIT_OK


def _ask_project_moved(moved_from: str, root: str) -> bool:
    """Ask on a terminal whether the scripts moved with the store; off one, they stayed."""
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        return False
    old_project, new_project = os.path.dirname(moved_from), os.path.dirname(root)
    sys.stderr.write(
        f"the store moved from {moved_from} to {root}. Did the project move too (its "
        f"scripts now under {new_project} rather than {old_project})? [y/N] "
    )
    sys.stderr.flush()
    try:
        answer = sys.stdin.readline()
    except (OSError, UnicodeDecodeError):
        return False
    return answer.strip().lower() in ("y", "yes")


__all__ = ["add_settle_arguments", "cmd_adopt", "cmd_settle"]
