"""Schema versions of stored records and the registry of their migrations.

A migration upgrades the plain-dict form of one record type from version ``n``
to ``n + 1``; reading applies them in order, so a run written by an older
afk_local keeps loading. Records are never rewritten in place.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import msgspec

from afk_local.errors import CheckpointCorruptionError, SchemaVersionError
from afk_local.storage.format.records import SCHEMA_VERSION

_T = TypeVar("_T")
RecordMigration = Callable[[dict[str, Any]], dict[str, Any]]

_MIGRATIONS: dict[tuple[str, int], RecordMigration] = {}


def register(
    record_type: type[Any], from_version: int
) -> Callable[[RecordMigration], RecordMigration]:
    """Register a function upgrading ``record_type`` dicts from ``from_version`` to the next."""

    def decorate(fn: RecordMigration) -> RecordMigration:
        _MIGRATIONS[(record_type.__name__, from_version)] = fn
        return fn

    return decorate


def upgrade(cls: type[_T], data: Any, path: str) -> _T:
    """Bring the decoded msgpack ``data`` of a ``cls`` record to ``SCHEMA_VERSION``."""
    if not isinstance(data, dict):
        raise CheckpointCorruptionError(path, f"record is a {type(data).__name__}, not a map")
    version = data.get("schema_version", 1)
    if not isinstance(version, int) or version < 1:
        raise CheckpointCorruptionError(path, f"bad schema_version {version!r}")
    if version > SCHEMA_VERSION:
        raise SchemaVersionError(path, version, SCHEMA_VERSION)
    while version < SCHEMA_VERSION:
        step = _MIGRATIONS.get((cls.__name__, version))
        if step is None:
            raise SchemaVersionError(path, version, SCHEMA_VERSION)
        data = step(dict(data))
        version += 1
        data["schema_version"] = version
    try:
        return msgspec.convert(data, cls)
    except msgspec.ValidationError as exc:
        raise CheckpointCorruptionError(path, f"record does not validate: {exc}") from None
