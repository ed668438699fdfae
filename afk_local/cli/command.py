"""What every ``afk-local`` command shares: exit codes, :class:`CliError`, the store, output.

The commands live in :mod:`~afk_local.cli.commands.read` (runs, show, log, inspect, effects,
diff, verify, export), :mod:`~afk_local.cli.commands.write` (import, fork, resume, cancel, gc,
demo) and :mod:`~afk_local.cli.commands.watch` (watch, submit); :mod:`~afk_local.cli.main`
wires them into argparse and turns errors into exit codes.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import Any

from afk_local.errors import RunNotFoundError
from afk_local.storage import fsio
from afk_local.storage.format.values import plain
from afk_local.storage.rundir.options import ROOT_ENV, store_root
from afk_local.storage.store import Store
from afk_local.storage.trust import trust_warnings
from afk_local.storage.views.run_info import RunInfo

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_USAGE = 2
EXIT_LOCKED = 75
"""``resume``: another process holds the run's lock (EX_TEMPFAIL; the watcher's lost race)."""


class CliError(Exception):
    """A user error: printed as one line, exit code 2 (or ``code``)."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def emit_json(value: Any) -> None:
    """Write ``value`` to stdout as indented JSON (``--json``)."""
    sys.stdout.write(_json_text(value, indent=2) + "\n")


def _json_text(value: Any, indent: int | None = None) -> str:
    """``value`` as JSON text (:func:`~afk_local.storage.format.values.plain`, as
    exports write it): json is loaded by the commands that print JSON."""
    import json  # noqa: PLC0415

    return json.dumps(plain(value), indent=indent, ensure_ascii=False)


def out(text: str = "") -> None:
    """Write one line to stdout."""
    sys.stdout.write(text + "\n")


def open_store(args: argparse.Namespace, *, create: bool = False) -> Store:
    """The store ``--root`` names (else ``$AFK_LOCAL_ROOT``, else ``./.afk``).

    The directory must exist (a mistyped ``--root`` is an error, never a new empty
    store) unless ``create``: then it is made, with its missing parents.

    Raises:
        CliError: the root does not exist (and not ``create``), or is not a directory.
    """
    root = getattr(args, "root", None)
    path = store_root(root)
    if path.is_dir():
        return Store(path)
    if path.exists() or path.is_symlink():
        raise CliError(
            f"cannot use {path}: a file is in the way (not a directory); choose a store "
            f"directory with --root or {ROOT_ENV}"
        )
    for parent in path.absolute().parents:
        if parent.exists() and not parent.is_dir():
            raise CliError(
                f"cannot use {path}: a file is in the way ({parent} is not a directory); "
                f"choose a store directory with --root or {ROOT_ENV}"
            )
    if create:
        fsio.make_dirs(path)
        return Store(path)
    given = "--root" if root else (ROOT_ENV if os.environ.get(ROOT_ENV) else "the default ./.afk")
    raise CliError(
        f"no store at {path} (from {given}): the directory does not exist; check the path, "
        f"or give the store's directory with --root or {ROOT_ENV}"
    )


def suggest(args: argparse.Namespace, *words: object) -> str:
    """A command line the user can paste as it is: ``afk-local [--root R] WORDS``, shell-quoted.

    ``--root`` is repeated when the user gave it (``$AFK_LOCAL_ROOT`` stays set in
    their shell, the default needs nothing).
    """
    parts: list[str] = ["afk-local"]
    root = getattr(args, "root", None)
    if root:
        parts += ["--root", str(root)]
    parts += [str(w) for w in words]
    return " ".join(shlex.quote(p) for p in parts)


def require_run(store: Store, run_id: str) -> None:
    """Raise :class:`~afk_local.RunNotFoundError` unless ``run_id`` is a run of ``store``
    (:class:`~afk_local.UntrustedStoreError` when its directory is a symlink)."""
    paths = store.paths(run_id, refuse_links=True)  # validates the id, refuses a symlinked run dir
    if not os.path.lexists(paths.meta):  # a run.meta that is not a file: reading says so
        raise RunNotFoundError(run_id, str(store.root))


def warn_untrusted(store: Store, run_id: str | None = None) -> None:
    """Read-only commands still read an untrusted store: say why nothing would run from it."""
    for line in trust_warnings(store, run_id):
        sys.stderr.write(f"afk-local: warning: {line} (read anyway; nothing is executed)\n")


def info_dict(info: RunInfo) -> dict[str, Any]:
    """One run's summary as the JSON object ``runs``, ``import`` and ``fork`` print.

    :meth:`RunInfo.to_record`: the run's place, owner and size, its tags and its
    progress (``done``, ``total``, ``fraction``, ``active_ms``, ``eta_s``).
    """
    return info.to_record()


def short(value: Any, limit: int = 80) -> str:
    """``value`` as JSON on one line, cut to ``limit`` characters."""
    text = _json_text(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


__all__ = [
    "EXIT_LOCKED",
    "EXIT_OK",
    "EXIT_PROBLEMS",
    "EXIT_USAGE",
    "CliError",
    "emit_json",
    "info_dict",
    "open_store",
    "out",
    "require_run",
    "short",
    "suggest",
    "warn_untrusted",
]
