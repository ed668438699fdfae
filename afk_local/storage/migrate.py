"""Kept for one release: schema migrations now live in :mod:`afk_local.storage.format.migrate`.

``afk_local.storage.migrate.register`` is the path docs/format.md named before the
storage engine was split into layers; it keeps working until the next release.
Import from :mod:`afk_local.storage.format.migrate` instead.
"""

from __future__ import annotations

from afk_local.storage.format.migrate import RecordMigration, register, upgrade

__all__ = ["RecordMigration", "register", "upgrade"]
