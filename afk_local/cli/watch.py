"""The command-line side of the watcher: ``watch``, ``submit``, ``resume --via-watcher``.

:mod:`afk_local.cli.main` registers the subcommands with :func:`add_watch_arguments`
and :func:`add_submit_arguments`, so the flags live next to the code that uses them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from afk_local.storage.store import Store, default_root
from afk_local.watcher import service as watcher_service
from afk_local.watcher.requests import resume_request, submit_request
from afk_local.watcher.watcher import Watcher, WatchEvent

EXIT_OK = 0
EXIT_USAGE = 2


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
    p.add_argument("--json", action="store_true", help="events as JSON lines")
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
    p.add_argument("--json", action="store_true", help="machine-readable output")


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
            if event.log and event.kind in ("resumed", "failed", "backoff"):
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


def _store(args: argparse.Namespace) -> Store:
    root = getattr(args, "root", None)
    return Store(Path(root) if root else default_root())


def cmd_watch(args: argparse.Namespace) -> int:
    """``afk-local watch``: resume interrupted runs now and as they appear."""
    store = _store(args)
    if getattr(args, "install", None):
        return watcher_service.main_install(args.install, store.root.resolve(), sys.stdout)
    if getattr(args, "uninstall", None):
        return watcher_service.main_uninstall(args.uninstall, sys.stdout, store.root.resolve())
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
        if getattr(args, "once", False):
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
    """``afk-local submit MODULE:FUNCTION [ARGS]``: hand a new job to the watcher."""
    store = _store(args)
    try:
        positional, keywords = _parse_args_json(args.job_args)
        run_id, path = submit_request(
            store, args.entrypoint, positional, keywords, run_id=args.run_id
        )
    except ValueError as exc:
        sys.stderr.write(f"afk-local: {exc}\n")
        return EXIT_USAGE
    if store.exists(run_id):
        path.unlink(missing_ok=True)
        sys.stderr.write(f"afk-local: run {run_id!r} exists already; choose another --run-id\n")
        return EXIT_USAGE
    if args.json:
        sys.stdout.write(json.dumps({"run_id": run_id, "request": str(path)}) + "\n")
    else:
        sys.stdout.write(
            f"submitted {args.entrypoint} as run {run_id}; a running `afk-local watch` starts it\n"
            f"follow it with: afk-local show {run_id}\n"
        )
    return EXIT_OK


def request_resume(args: argparse.Namespace, store: Store, value: Any) -> int:
    """``afk-local resume RUN --via-watcher``: drop a resume request for the watcher."""
    has_input = getattr(args, "input", None) is not None
    path = resume_request(store, args.run, value, has_input=has_input)
    if getattr(args, "json", False):
        sys.stdout.write(json.dumps({"run_id": args.run, "request": str(path)}) + "\n")
    else:
        sys.stdout.write(
            f"asked the watcher to resume {args.run} ({path.name}); "
            "it needs a running `afk-local watch`\n"
        )
    return EXIT_OK
