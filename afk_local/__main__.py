"""``python -m afk_local``: the same as the ``afk-local`` command."""

from afk_local.cli import main

raise SystemExit(main())
