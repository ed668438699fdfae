"""The ``afk-local`` command line (argparse); ``python -m afk_local`` is the same.

Every command takes ``--root`` (else ``$AFK_LOCAL_ROOT``, else ``./.afk``; it must
exist, except for the commands that create a store) and ``--json`` for scripts. Exit
codes: 0 ok, 1 problems found (``verify``, a resumed job that failed), 2 usage errors,
a missing store, unknown runs or checkpoints, bad input, a run that cannot be resumed.
Errors are one line on stderr saying what to do; user errors never print a traceback.
docs/cli.md shows every command with its output.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from afk_local import __version__
from afk_local.cli.command import (
    EXIT_OK,
    EXIT_PROBLEMS,
    EXIT_USAGE,
    CliError,
    out,
)
from afk_local.errors import (
    AfkLocalError,
    DiskFullError,
    ReplayDivergence,
    RunLockedError,
    StoreReadOnlyError,
    StoreUnusableError,
)
from afk_local.storage.rundir.options import ROOT_ENV, default_root


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value}")
    return value


def _at_least_one(text: str) -> int:
    value = _positive_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {value}")
    return value


def _seq(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"a checkpoint seq is a whole number, got {text!r}"
        ) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"a checkpoint seq is >= 1, got {value}")
    return value


def _size(text: str) -> int:
    units = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
    clean = text.strip().lower().removesuffix("b")
    factor = units.get(clean[-1:], 1)
    number = clean[:-1] if clean[-1:] in units else clean
    try:
        value = int(float(number) * factor)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a size like 500M or 2G, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("a size is >= 0")
    return value


def _command_of(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names (the first word that is not an option or the value of
    ``--root``), or None."""
    words = iter(argv)
    for word in words:
        if word == "--root":
            next(words, None)
        elif word == "--":
            return next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def _load(spec: str) -> Callable[..., Any]:
    """The function ``module:name`` names, from ``afk_local.cli.commands.<module>``."""
    module, _, name = spec.partition(":")
    function: Callable[..., Any] = getattr(
        importlib.import_module(f"afk_local.cli.commands.{module}"), name
    )
    return function


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argument parser of ``afk-local``.

    Args:
        command: declare the arguments of this command only (the others are listed
            with their help line): a command then imports only its own modules.
    """
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--root",
        default=argparse.SUPPRESS,
        help=f"the store directory (default: ${ROOT_ENV}, else ./.afk)",
    )
    # --json is taken before the command too (`afk-local --json runs`), like --root: the
    # SUPPRESS default keeps a command's parser from resetting what was given before it.
    reading = argparse.ArgumentParser(add_help=False, parents=[common])
    reading.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output"
    )

    parser = argparse.ArgumentParser(
        prog="afk-local",
        description="Inspect, resume, fork and clean afk_local checkpoint runs.",
        parents=[reading],
    )
    parser.add_argument("--version", action="version", version=f"afk-local {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def add(
        name: str,
        handler: str,
        help_text: str,
        *,
        json_flag: bool = True,
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(
            name, help=help_text, description=help_text, parents=[reading if json_flag else common]
        )
        p.set_defaults(handler=handler)
        return p

    def arguments(name: str, adder: str, p: argparse.ArgumentParser, *more: object) -> None:
        """Declare command ``name``'s arguments with ``adder`` (``module:function``),
        imported only when ``name`` is the command being parsed, or when none is."""
        if command in (None, name):
            _load(adder)(p, *more)

    p = add("runs", "listing:cmd_runs", "list runs, newest created first")
    arguments("runs", "listing:add_filter_arguments", p)
    p.add_argument("--remote", metavar="URL", help="list the runs on this remote instead")

    p = add("show", "read:cmd_show", "everything about one run")
    p.add_argument("run", metavar="RUN")

    p = add("log", "read:cmd_log", "the checkpoint chain of a run")
    p.add_argument("run", metavar="RUN")
    p.add_argument("--limit", type=_positive_int, help="only the newest N checkpoints")

    p = add("inspect", "read:cmd_inspect", "the payload of one checkpoint (default: latest)")
    p.add_argument("run", metavar="RUN")
    p.add_argument("seq", metavar="SEQ", nargs="?", type=_seq)
    p.add_argument("--path", help="dotted path into the payload, e.g. state.items.0")
    p.add_argument(
        "--conversation",
        action="store_true",
        help="an agent run's conversation (prompt, model answers, tool calls and results)",
    )

    p = add("effects", "read:cmd_effects", "journaled side effects: intent, outcome, in doubt")
    p.add_argument("run", metavar="RUN")

    p = add("diff", "read:cmd_diff", "structural diff of two checkpoints' payloads")
    p.add_argument("run", metavar="RUN")
    p.add_argument("seq_a", metavar="SEQ_A", type=_seq)
    p.add_argument("seq_b", metavar="SEQ_B", type=_seq)

    p = add("verify", "read:cmd_verify", "check every file of every run (exit 1 on damage)")
    p.add_argument("runs", metavar="RUN", nargs="*")
    p.add_argument("--no-repair", action="store_true", help="report torn journal tails only")

    p = add("export", "read:cmd_export", "a run as JSON (meta, checkpoints, effects)")
    p.add_argument("run", metavar="RUN")
    p.add_argument("--format", choices=("json", "jsonl"), default="json")
    p.add_argument("-o", "--output", help="write to this file instead of stdout")

    p = add("import", "write:cmd_import", "recreate an exported run (FILE or - for stdin)")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--as", dest="as_id", metavar="NEW_ID", help="import under another run id")

    p = add("resume", "write:cmd_resume", "continue a run (its job is found where it ran)")
    p.add_argument("run", metavar="RUN")
    p.add_argument("--input", metavar="JSON", help="the answer for a paused run, as JSON")
    p.add_argument(
        "--in-doubt",
        choices=("retry", "raise"),
        help="effects a crash left in doubt: call them again (retry) or stop (raise)",
    )
    p.add_argument(
        "--pause-seq",
        type=_seq,
        metavar="SEQ",
        help="apply --input only while the run waits at the pause of checkpoint SEQ",
    )
    p.add_argument(
        "--via-watcher", action="store_true", help="ask the running watcher to resume it"
    )
    p.add_argument(
        "--trust",
        action="store_true",
        help="vouch for the run as it is on disk: run an imported run, accept a run put "
        "back from a backup (docs/security.md)",
    )

    p = add(
        "replay",
        "replay:cmd_replay",
        "run the job's current code against RUN's journal, calling nothing (exit 1: it diverges)",
    )
    p.add_argument("run", metavar="RUN", nargs="?")
    p.add_argument(
        "--all", action="store_true", help="every run of a durable job (narrow with the filters)"
    )
    arguments("replay", "listing:add_filter_arguments", p)

    p = add("settle", "repair:cmd_settle", "record what happened to an effect left in doubt")
    arguments("settle", "repair:add_settle_arguments", p)

    p = add("adopt", "repair:cmd_adopt", "make a copied or moved store's new directory its home")
    moved = p.add_mutually_exclusive_group()
    moved.add_argument(
        "--project-moved",
        dest="project_moved",
        action="store_const",
        const=True,
        help="the scripts moved along with the store: re-home the runs' recorded paths",
    )
    moved.add_argument(
        "--project-stayed",
        dest="project_moved",
        action="store_const",
        const=False,
        help="only the store moved: keep the scripts and directories the runs recorded",
    )

    p = add("fork", "write:cmd_fork", "a new run continuing from checkpoint SEQ of RUN")
    p.add_argument("run", metavar="RUN")
    p.add_argument("--at", type=_seq, metavar="SEQ", help="the checkpoint to continue from")
    p.add_argument(
        "--salvage",
        action="store_true",
        help="RUN's effect journal is damaged: keep its intact part, report what is lost "
        "and in doubt (without --at: from the newest checkpoint before the damage)",
    )
    p.add_argument("--as", dest="as_id", metavar="NEW_ID", help="the new run's id")
    p.add_argument(
        "--set",
        action="append",
        metavar="PATH=JSON",
        help="set a value in the state the fork continues from (state.total=0); repeatable",
    )

    p = add(
        "restart", "manage:cmd_restart", "a new run of RUN's job with the same inputs, started now"
    )
    p.add_argument("run", metavar="RUN")
    p.add_argument("--as", dest="as_id", metavar="NEW_ID", help="the new run's id")
    p.add_argument(
        "--no-start", action="store_true", help="only create it (status created), run nothing"
    )

    p = add("rm", "manage:cmd_rm", "delete runs (their effect journals are kept)")
    p.add_argument("runs", metavar="RUN", nargs="+")
    p.add_argument("--force", action="store_true", help="also failed and cancelled runs")
    p.add_argument(
        "--with-effects",
        action="store_true",
        help="delete the effect journal too (default: kept under <root>/removed/)",
    )

    p = add("metrics", "metrics:cmd_metrics", "the metrics a run recorded (ctx.metric)")
    p.add_argument("run", metavar="RUN")
    p.add_argument("--name", metavar="NAME", help="only this metric")

    p = add("cancel", "write:cmd_cancel", "mark a run cancelled so nothing resumes it")
    p.add_argument("run", metavar="RUN")
    p.add_argument("--reason", default="cancelled from the command line")

    p = add("gc", "write:cmd_gc", "compact runs and delete old finished runs")
    p.add_argument("--dry-run", action="store_true", help="say what would go, change nothing")
    p.add_argument("--keep-runtime-states", type=_positive_int, default=3, metavar="N")
    p.add_argument(
        "--keep-phase",
        action="append",
        metavar="PHASE",
        help="always keep checkpoints of this phase (repeatable; replaces the default set)",
    )
    p.add_argument("--no-keep-latest-step", action="store_true")
    p.add_argument("--max-effects-per-run", type=_positive_int, metavar="N")
    p.add_argument("--max-runs", type=_positive_int, metavar="N")
    p.add_argument("--max-age-days", type=float, metavar="DAYS")
    p.add_argument("--max-bytes", type=_size, metavar="SIZE", help="e.g. 500M, 2G")

    p = add("pack", "write:cmd_pack", "fold older checkpoint files into pack files (fewer files)")
    p.add_argument("runs", metavar="RUN", nargs="*", help="default: every run")
    p.add_argument(
        "--keep-loose",
        type=_at_least_one,
        default=1,
        metavar="N",
        help="the newest N checkpoint files of each run stay loose (default 1)",
    )
    p.add_argument(
        "--no-merge", action="store_true", help="add a pack, leave the existing packs alone"
    )
    p.add_argument("--dry-run", action="store_true", help="say what would be packed, do nothing")

    p = add("demo", "write:cmd_demo", "crash a job with SIGKILL and resume it (a few seconds)")
    p.add_argument("--steps", type=_positive_int, default=40)
    p.add_argument("--keep", action="store_true", help="keep the temporary store and print it")

    p = add("push", "remote:cmd_push", "upload runs to a remote, incrementally (remote extra)")
    arguments("push", "remote:add_push_arguments", p)
    p = add("pull", "remote:cmd_pull", "copy a run from a remote, verified; --take moves its lease")
    arguments("pull", "remote:add_pull_arguments", p)

    p = add(
        "watch",
        "watch:cmd_watch",
        "resume interrupted runs now and as they appear",
        json_flag=False,
    )
    arguments("watch", "watch:add_watch_arguments", p)
    p = add("submit", "watch:cmd_submit", "hand a job to the watcher", json_flag=False)
    arguments("submit", "watch:add_submit_arguments", p)
    p = add(
        "ui", "ui:cmd_ui", "the store as a local web page on loopback (ui extra)", json_flag=False
    )
    arguments("ui", "ui:add_ui_arguments", p)
    p = add(
        "schedule",
        "schedule:cmd_schedule",
        "start a job on a schedule: add, list, rm",
        json_flag=False,
    )
    arguments("schedule", "schedule:add_schedule_arguments", p, reading)
    return parser


def _unusable(args: argparse.Namespace, exc: OSError) -> int:
    """The store's directory cannot be used: one line naming it and the reason, exit 2."""
    where = exc.filename or getattr(args, "root", None) or default_root()
    reason = exc.strerror or str(exc)
    if exc.errno in (errno.ENOTDIR, errno.EEXIST):
        reason = "a file is in the way (not a directory)"
    sys.stderr.write(
        f"afk-local: cannot use {where}: {reason}; choose a writable "
        f"directory with --root or {ROOT_ENV}\n"
    )
    return EXIT_USAGE


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    words = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(_command_of(words))
    args = parser.parse_args(words)
    if getattr(args, "handler", None) is None:
        parser.print_help(sys.stdout)
        return EXIT_USAGE
    if getattr(args, "root", None) is None:
        args.root = None
    args.json = bool(getattr(args, "json", False))
    try:
        handler = args.handler  # "module:function", or a function a command's own
        # argument declarations set (schedule add/list/rm)
        return int((_load(handler) if isinstance(handler, str) else handler)(args))
    except CliError as exc:
        if exc.code == EXIT_OK:
            out(str(exc))
            return EXIT_OK
        sys.stderr.write(f"afk-local: {exc}\n")
        return exc.code
    except RunLockedError as exc:
        sys.stderr.write(f"afk-local: {exc}\n")
        return EXIT_USAGE
    except ReplayDivergence as exc:  # a resume refused: the code no longer fits the run
        sys.stderr.write(f"afk-local: {exc}\n")
        return EXIT_PROBLEMS
    except DiskFullError as exc:  # not a usage error: the same command works once there is room
        sys.stderr.write(f"afk-local: {exc}\n")
        return EXIT_PROBLEMS
    except StoreReadOnlyError as exc:  # what is read-only and what still works
        sys.stderr.write(f"afk-local: {exc}\n")
        return EXIT_USAGE
    except StoreUnusableError as exc:  # said in CLI terms (--root), like any OSError below
        return _unusable(args, exc)
    except AfkLocalError as exc:
        sys.stderr.write(f"afk-local: {exc}\n")
        return EXIT_USAGE
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        sys.stderr.write(f"afk-local: bad input: {exc}\n")
        return EXIT_USAGE
    except OSError as exc:
        return _unusable(args, exc)
    except KeyboardInterrupt:
        sys.stderr.write("afk-local: interrupted\n")
        return 130


__all__ = ["build_parser", "main"]
