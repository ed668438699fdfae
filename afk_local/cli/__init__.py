"""``afk-local``, the command line: argparse wiring, one module per command group.

:func:`main` is the ``afk-local`` entry point (and ``python -m afk_local``).
"""

from afk_local.cli.main import main

__all__ = ["main"]
