"""The command-line side of the watcher: ``watch``, ``submit``, ``resume --via-watcher``.

:mod:`afk_local.cli.main` registers the subcommands with :func:`add_watch_arguments`
and :func:`add_submit_arguments`, so the flags live next to the code that uses them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, TextIO

from afk_local.cli.command import EXIT_OK, CliError, open_store, suggest
from afk_local.errors import RunExistsError
from afk_local.runner.code.entrypoints import is_entrypoint
from afk_local.runner.operations.resume import load_entrypoint
from afk_local.storage.format.layout import validate_run_id
from afk_local.storage.rundir.options import store_root
from afk_local.storage.store import Store
from afk_local.watcher import service as watcher_service
from afk_local.watcher.requests import resume_request
from afk_local.watcher.watcher import Watcher, WatchEvent


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {value}")
    return value


def add_watch_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``afk-local watch``."""
    p.add_argument("--once", action="store_true", help="sweep, wait for what it started, exit")
    p.add_argument("--concurrency", type=_count, default=4, metavar="N", help="children at once")
    p.add_argument(
        "--max-attempts",
        type=_count,
        default=5,
        metavar="N",
        help="automatic resumes without progress before a run is marked failed (default 5)",
    )
    p.add_argument(
        "--interval", type=_positive_float, default=2.0, metavar="S", help="seconds between sweeps"
    )
    p.add_argument(
        "--backoff",
        type=_positive_float,
        default=5.0,
        metavar="S",
        help="wait before the 2nd attempt of a crashing run; doubles each time (default 5)",
    )
    p.add_argument(
        "--grace",
        type=_positive_float,
        default=10.0,
        metavar="S",
        help="seconds children get to checkpoint and exit when the watcher stops",
    )
    p.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="events as JSON lines"
    )
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--install",
        choices=("systemd", "launchd"),
        help="write a user service that starts the watcher at login",
    )
    group.add_argument(
        "--uninstall",
        nargs="?",
        const="auto",
        choices=("systemd", "launchd", "auto"),
        help="remove the user service",
    )


def add_submit_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``afk-local submit``."""
    p.add_argument("entrypoint", metavar="MODULE:FUNCTION", help="an @afk.durable job")
    p.add_argument(
        "job_args",
        metavar="ARGS",
        nargs="?",
        help="its arguments as JSON: a list (positional) or an object (keywords)",
    )
    p.add_argument("--run-id", help="the new run's id (default: a fresh one)")
    p.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output"
    )


class EventPrinter:
    """Prints one line per event; on a terminal also a live summary line (stderr)."""

    def __init__(self, *, as_json: bool, out: TextIO | None = None, live: bool | None = None):
        self.as_json = as_json
        self.out = out or sys.stdout
        err = sys.stderr
        self.live = (not as_json and err.isatty()) if live is None else live
        self.watcher: Watcher | None = None
        self._shown = False

    def __call__(self, event: WatchEvent) -> None:
        """Print ``event``."""
        self._clear()
        if self.as_json:
            self.out.write(json.dumps(event.to_dict(), ensure_ascii=False) + "\n")
        else:
            stamp = time.strftime("%H:%M:%S", time.localtime(event.ts_ms / 1000))
            text = f"{stamp} {event.kind:<9} {event.run_id or '-'}"
            if event.message:
                text += f"  {event.message}"
            if event.log and event.kind in ("started", "resumed", "failed", "backoff"):
                text += f"  (log: {event.log})"
            self.out.write(text + "\n")
        self.out.flush()

    def tick(self) -> None:
        """Redraw the live summary line."""
        if not self.live or self.watcher is None:
            return
        sys.stderr.write("\r\x1b[K" + "watching: " + self.watcher.summary())
        sys.stderr.flush()
        self._shown = True

    def _clear(self) -> None:
        if self._shown:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
            self._shown = False


def cmd_watch(args: argparse.Namespace) -> int:
    """``afk-local watch``: resume interrupted runs now and as they appear.

    ``--once`` needs an existing store (a mistyped root is an error, not a new
    empty store); the long-running watcher and ``--install`` create it.
    """
    if getattr(args, "uninstall", None):
        root = getattr(args, "root", None)
        the_root = store_root(root).resolve()
        return watcher_service.main_uninstall(args.uninstall, sys.stdout, the_root)
    once = bool(getattr(args, "once", False))
    if getattr(args, "install", None):
        root = getattr(args, "root", None)
        try:  # before the store is created: a path no service file can hold is refused whole
            watcher_service.check_text("store directory", str(store_root(root).absolute()))
        except ValueError as exc:
            raise CliError(str(exc)) from None
    store = open_store(args, create=not once)
    if getattr(args, "install", None):
        try:
            return watcher_service.main_install(args.install, store.root.resolve(), sys.stdout)
        except ValueError as exc:
            raise CliError(str(exc)) from None
    printer = EventPrinter(as_json=bool(getattr(args, "json", False)))
    watcher = Watcher(
        store,
        concurrency=getattr(args, "concurrency", 4),
        max_attempts=getattr(args, "max_attempts", 5),
        interval=getattr(args, "interval", 2.0),
        backoff=getattr(args, "backoff", 5.0),
        grace=getattr(args, "grace", 10.0),
        on_event=printer,
    )
    printer.watcher = watcher
    restore = watcher.install_signal_handlers()
    try:
        if once:
            return watcher.run_once()
        if not printer.as_json:
            printer.out.write(
                f"watching {store.root} (every {watcher.interval:g}s, "
                f"{watcher.concurrency} at once); Ctrl-C stops\n"
            )
            printer.out.flush()
        return watcher.serve(on_tick=printer.tick)
    finally:
        printer._clear()
        restore()


def _parse_args_json(text: str | None) -> tuple[list[Any], dict[str, Any]]:
    if text is None:
        return [], {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"ARGS is not valid JSON ({exc.msg}); quote it for the shell, e.g. '[1, \"a\"]'"
        ) from None
    if isinstance(value, list):
        return value, {}
    if isinstance(value, dict):
        return [], value
    return [value], {}


def cmd_submit(args: argparse.Namespace) -> int:
    """``afk-local submit MODULE:FUNCTION [ARGS]``: a new run for the watcher to start.

    The entrypoint is imported here first (from the working directory too, as
    ``python -m`` would), so a typo fails now rather than in the watcher; the run is
    created at once (status ``created``) with where it was submitted from, so
    ``show`` works right away and the watcher's child finds the job the same way.
    """
    try:
        positional, keywords = _parse_args_json(args.job_args)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if not is_entrypoint(args.entrypoint):
        raise CliError(
            f"{args.entrypoint!r} is not module:function (e.g. mypkg.jobs:crawl): name an "
            "@afk.durable job in an importable module"
        )
    if args.entrypoint.startswith("__main__:"):
        raise CliError(
            "a job in __main__ cannot be submitted: name it by its module (mypkg.jobs:crawl), "
            "or run its script, which records the run itself"
        )
    if args.run_id is not None:
        validate_run_id(args.run_id)
    store = open_store(args, create=True)
    if args.run_id is not None and store.exists(args.run_id):
        raise CliError(f"run {args.run_id!r} exists already; choose another --run-id")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    job = load_entrypoint(args.entrypoint, args.run_id or "(new run)")
    try:
        run_id = job.with_store(store).submit(*positional, run_id=args.run_id, **keywords)
    except RunExistsError:
        raise CliError(f"run {args.run_id!r} exists already; choose another --run-id") from None
    except TypeError as exc:
        raise CliError(f"ARGS cannot be stored: {exc}") from None
    if args.json:
        sys.stdout.write(
            json.dumps(
                {
                    "run_id": run_id,
                    "status": "created",
                    "entrypoint": args.entrypoint,
                    "path": str(store.paths(run_id).dir),
                }
            )
            + "\n"
        )
    else:
        sys.stdout.write(
            f"submitted {args.entrypoint} as run {run_id} (status created); a running "
            f"`afk-local watch` starts it, or start it here: {suggest(args, 'resume', run_id)}\n"
            f"follow it with: {suggest(args, 'show', run_id)}\n"
        )
    return EXIT_OK


def request_resume(args: argparse.Namespace, store: Store, value: Any) -> int:
    """``afk-local resume RUN --via-watcher``: drop a resume request for the watcher.

    An answer (``--input``) names the pause it is for: the one the run waits at now,
    or ``--pause-seq``; the watcher applies it at most once, and only to that pause.
    """
    has_input = getattr(args, "input", None) is not None
    problem = store.key_problem()
    if problem is not None:  # the watcher would reject an unsigned request: say so now
        raise CliError(problem)
    path = resume_request(
        store, args.run, value, has_input=has_input, pause_seq=getattr(args, "pause_seq", None)
    )
    if getattr(args, "json", False):
        sys.stdout.write(
            json.dumps({"run_id": args.run, "status": "requested", "request": str(path)}) + "\n"
        )
    else:
        sys.stdout.write(
            f"asked the watcher to resume {args.run} ({path.name}); "
            "it needs a running `afk-local watch`\n"
        )
    return EXIT_OK
