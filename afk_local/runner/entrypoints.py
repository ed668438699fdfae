"""Entrypoints: the ``module:qualname`` a run records so another process can continue it.

Durable functions, rebuildable agents and watcher ``submit`` requests all name
their code this way; this module validates such names and imports what they
name, with errors that say why another process cannot.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

from afk_local.errors import EntrypointError

ENTRYPOINT = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")
"""What a valid entrypoint looks like: ``package.module:Qual.name``."""


def is_entrypoint(text: object) -> bool:
    """True when ``text`` is a well-formed ``module:qualname``."""
    return isinstance(text, str) and ENTRYPOINT.fullmatch(text) is not None


def import_entrypoint(run_id: str, entrypoint: str, *, unimportable_hint: str) -> Any:
    """Import the object ``entrypoint`` names.

    Args:
        run_id: the run, for the error message.
        entrypoint: ``module:qualname``.
        unimportable_hint: what to tell the user when the object lives in
            ``__main__``, a notebook or a function body (no other process can import it).

    Raises:
        EntrypointError: the name is malformed, unimportable, or not found.
    """
    module_name, _, qualname = entrypoint.partition(":")
    if module_name == "__main__" or "<locals>" in qualname:
        raise EntrypointError(run_id, entrypoint, unimportable_hint)
    if not is_entrypoint(entrypoint):
        raise EntrypointError(run_id, entrypoint, "not a module:qualname name")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise EntrypointError(
            run_id, entrypoint, f"{exc}; is its package installed / on PYTHONPATH here?"
        ) from exc
    return obj
