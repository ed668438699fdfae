"""``afk-local ui``: the store as a local web page (the extra ``afk_local[ui]``).

The server is imported inside the command, so ``afk-local`` starts and works
without the extra; without it the command says what to install.
"""

from __future__ import annotations

import argparse
import sys
import webbrowser

from afk_local.cli.command import EXIT_OK, CliError, open_store, out


def add_ui_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``ui``."""
    p.add_argument(
        "--port",
        type=int,
        default=0,
        metavar="P",
        help="port (default: a free one) on the page's own loopback address, 127.x.y.z",
    )
    p.add_argument("--open", action="store_true", help="open the page in a web browser")
    p.add_argument(
        "--read-only",
        action="store_true",
        help="show only: no settle, answer, resume, cancel, restart or fork from the page",
    )


def cmd_ui(args: argparse.Namespace) -> int:
    """``ui [--port P] [--open] [--read-only]``: serve the store's page on loopback."""
    if not 0 <= args.port <= 65535:
        raise CliError(f"--port must be 0..65535, got {args.port}")
    try:
        from afk_local.ui.server import serve  # noqa: PLC0415 - the extra, only when asked
    except ImportError as exc:
        raise CliError(
            f"afk-local ui needs the ui extra ({exc.name or exc} is missing): "
            "pip install 'afk_local[ui]'"
        ) from None
    store = open_store(args)

    def ready(url: str) -> None:
        out(f"afk-local ui: serving {store.root}{' (read-only)' if args.read_only else ''}")
        out(f"open: {url}")
        out("(the URL holds a token: share it with nobody; Ctrl-C stops the server)")
        sys.stdout.flush()
        if args.open:
            webbrowser.open(url)

    try:
        serve(store, port=args.port, read_only=args.read_only, on_ready=ready)
    except OSError as exc:
        raise CliError(
            f"cannot serve on port {args.port} of loopback: {exc.strerror or exc}"
        ) from None
    return EXIT_OK


__all__ = ["add_ui_arguments", "cmd_ui"]
