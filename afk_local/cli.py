"""The ``afk-local`` command line (argparse)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from afk_local import __version__


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``afk-local``."""
    parser = argparse.ArgumentParser(
        prog="afk-local", description="Inspect and manage afk_local checkpoint runs."
    )
    parser.add_argument("--version", action="version", version=f"afk-local {__version__}")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    parser = build_parser()
    parser.parse_args(argv)
    parser.print_help(sys.stdout)
    return 0
