"""Which code a run resumes under: code fingerprints, state versions and their migrations.

A durable job records a fingerprint of its source and its declared
``version`` in the run. On resume, :func:`check_code` warns about (or refuses)
changed source, and :func:`migrate_state` upgrades ``ctx.state`` written under
an older version through the functions registered with :func:`migration`.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import warnings
from collections.abc import Callable
from typing import Any, Literal

from afk_local.errors import CodeChangedError
from afk_local.storage.format.records import RunMeta

log = logging.getLogger("afk_local")

OnCodeChange = Literal["resume", "refuse", "replay"]
StateMigration = Callable[[dict[str, Any]], dict[str, Any]]

_MIGRATIONS: dict[tuple[str, str], StateMigration] = {}


class CodeChangedWarning(UserWarning):
    """A run resumes under code (or a version) different from the one that started it."""


def migration(from_version: str, to_version: str) -> Callable[[StateMigration], StateMigration]:
    """Register ``fn(state) -> state`` upgrading ``ctx.state`` of runs made under ``from_version``.

    Applied when a run whose last checkpoint was written under ``from_version``
    resumes under a job declared with ``version=to_version`` (chains are
    followed: 1 -> 2 -> 3). The migrated state is checkpointed before the job runs.

    Example:
        >>> @afk.migration("1", "2")  # doctest: +SKIP
        ... def add_seen(state):
        ...     return {**state, "seen": []}
    """

    def register(fn: StateMigration) -> StateMigration:
        _MIGRATIONS[(str(from_version), str(to_version))] = fn
        return fn

    return register


def _migration_path(start: str, goal: str) -> list[tuple[str, StateMigration]] | None:
    """The shortest chain of registered migrations from ``start`` to ``goal``."""
    frontier: list[tuple[str, list[tuple[str, StateMigration]]]] = [(start, [])]
    seen = {start}
    while frontier:
        version, path = frontier.pop(0)
        if version == goal:
            return path
        for (src, dst), fn in _MIGRATIONS.items():
            if src == version and dst not in seen:
                seen.add(dst)
                frontier.append((dst, [*path, (dst, fn)]))
    return None


def code_fingerprint(fn: Callable[..., Any]) -> str:
    """A digest of ``fn``'s source (``src:...``), or of its bytecode when there is no source."""
    try:
        data = inspect.getsource(fn).encode()
        kind = "src"
    except (OSError, TypeError):
        code = getattr(fn, "__code__", None)
        if code is None:
            return "none"
        data = code.co_code + repr((code.co_consts, code.co_names)).encode()
        kind = "code"
    return f"{kind}:{hashlib.blake2b(data, digest_size=12).hexdigest()}"


def check_code(
    run_id: str,
    meta: RunMeta,
    *,
    entrypoint: str,
    fingerprint: str,
    on_code_change: OnCodeChange,
) -> None:
    """Warn (or, with ``on_code_change="refuse"``, raise) when the job's source changed.

    Raises:
        CodeChangedError: the source changed and the job refuses to resume under it.
    """
    recorded = meta.code_fingerprint
    if recorded is None or recorded == fingerprint:
        return
    if on_code_change == "refuse":
        raise CodeChangedError(run_id, entrypoint, recorded, fingerprint)
    message = (
        f"run {run_id!r}: resuming {entrypoint} under changed code "
        f"({recorded} -> {fingerprint}); finished steps are replayed, a step whose "
        "inputs changed raises EffectMismatchError"
    )
    # Said once: the warning reaches the terminal; the log keeps it below WARNING, or
    # logging's last-resort handler would print it a second time.
    log.info("%s", message)
    # stacklevel: check_code <- _reopen <- _begin <- _sync/_async <- run/arun
    warnings.warn(message, CodeChangedWarning, stacklevel=5)


def migrate_state(
    run_id: str,
    state: dict[str, Any],
    old: str | None,
    new: str | None,
    *,
    entrypoint: str,
    on_code_change: OnCodeChange,
) -> dict[str, Any]:
    """``state`` written under version ``old``, upgraded to ``new`` by the registered migrations.

    With no chain of migrations from ``old`` to ``new`` the state is returned as
    it is, with a :class:`CodeChangedWarning` (or :class:`CodeChangedError` under
    ``on_code_change="refuse"``).
    """
    path = None
    if old is not None and new is not None:
        path = _migration_path(old, new)
    if path is None:
        message = (
            f"run {run_id!r}: its state was written under version {old!r}, the job is now "
            f"version {new!r} and no afk.migration connects them; resuming with "
            "the state as it is"
        )
        if on_code_change == "refuse":
            raise CodeChangedError(run_id, entrypoint, f"version {old}", f"{new}")
        log.info("%s", message)  # said once, by the warning (see check_code)
        # stacklevel: migrate_state <- _attempt <- _reopen <- _begin <- _sync/_async <- run/arun
        warnings.warn(message, CodeChangedWarning, stacklevel=6)
        return state
    for version, fn in path:
        state = fn(state)
        if not isinstance(state, dict):
            raise TypeError(
                f"migration to version {version} returned {type(state).__name__}, not a dict"
            )
        log.info("run %s: migrated state to version %s", run_id, version)
    return state


__all__ = [
    "CodeChangedWarning",
    "OnCodeChange",
    "StateMigration",
    "check_code",
    "code_fingerprint",
    "migrate_state",
    "migration",
]
