"""``afk-local``, the command line: argparse wiring, one module per command group.

:func:`main` is the ``afk-local`` entry point (and ``python -m afk_local``). It imports
:mod:`afk_local.cli.main` when called, which imports a command's modules only once the
command is known: ``afk-local runs`` never loads the runner, agent or watcher.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line (``argv``: default ``sys.argv[1:]``); returns the exit code."""
    module = importlib.import_module("afk_local.cli.main")
    globals()["main"] = _entry  # importing the submodule bound its name here
    return int(module.main(argv))


_entry = main

__all__ = ["main"]
