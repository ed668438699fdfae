"""``afk-local``, the command line: argparse wiring, one module per command group.

:func:`main` is the ``afk-local`` entry point (and ``python -m afk_local``). It imports a
command's own modules only once the command is known: ``afk-local runs`` never loads
the runner, agent or watcher.
"""

from afk_local.cli.main import main

__all__ = ["main"]
