"""Entrypoints: the ``module:qualname`` a run records so another process can continue it.

Durable functions, rebuildable agents and watcher ``submit`` requests all name
their code this way; this module validates such names and imports what they
name, with errors that say why another process cannot.

:func:`import_entrypoint` is the only place that turns a name from a store into
an object, and it accepts only the types its caller names (an ``@afk.durable``
function; an ``Agent`` or an ``@afk.agent_factory``): whatever else a crafted
``run.meta`` names (``subprocess:run``, ``os:system``) is refused before it is
called. Callers run the trust gate first (:func:`afk_local.storage.trust.require_trusted_run`).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from afk_local.errors import EntrypointError
from afk_local.storage.format.layout import ENTRYPOINT


def is_entrypoint(text: object) -> bool:
    """True when ``text`` is a well-formed ``module:qualname``."""
    return isinstance(text, str) and ENTRYPOINT.fullmatch(text) is not None


def name_in_module(obj: object, module_name: str | None) -> str | None:
    """``"module:name"``: where ``obj`` itself sits at the top level of the imported module
    ``module_name``, or None (not imported, or not there: made inside a function)."""
    module = sys.modules.get(module_name or "")
    if module is None:
        return None
    try:
        attributes = list(vars(module).items())
    except TypeError:  # an odd object in sys.modules
        return None
    for name, value in attributes:
        if value is obj and is_entrypoint(f"{module.__name__}:{name}"):
            return f"{module.__name__}:{name}"
    return None


def import_entrypoint(
    run_id: str,
    entrypoint: str,
    *,
    unimportable_hint: str,
    accept: tuple[type, ...],
    accept_name: str,
) -> Any:
    """Import the object ``entrypoint`` names, refusing any object not of the ``accept`` types.

    Args:
        run_id: the run, for the error message.
        entrypoint: ``module:qualname``.
        unimportable_hint: what to tell the user when the object lives in
            ``__main__``, a notebook or a function body (no other process can import it).
        accept: the types the object must have (checked with ``isinstance``).
        accept_name: those types in words, for the error message.

    Raises:
        EntrypointError: the name is malformed, unimportable, not found, or names
            something else than ``accept`` (which is then never called).
    """
    module_name, _, qualname = entrypoint.partition(":")
    if module_name == "__main__" or "<locals>" in qualname:
        raise EntrypointError(run_id, entrypoint, unimportable_hint)
    if not is_entrypoint(entrypoint):
        raise EntrypointError(run_id, entrypoint, "not a module:qualname name")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise EntrypointError(
            run_id,
            entrypoint,
            f"{exc}: install its package here or put it on PYTHONPATH, then resume the run",
            gone=isinstance(exc, ModuleNotFoundError),
        ) from exc
    obj: Any = module
    try:
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        where = getattr(module, "__file__", None) or module_name
        raise EntrypointError(
            run_id,
            entrypoint,
            f"{module_name} ({where}) no longer defines {qualname} (renamed or removed?): "
            f"put it back under that name, then resume the run; or cancel it "
            f"(`afk-local cancel {run_id}`) and start a new one",
            gone=True,
        ) from None
    if not isinstance(obj, accept):
        raise EntrypointError(
            run_id,
            entrypoint,
            f"it names a {type(obj).__name__}, and afk-local calls nothing else a run "
            f"names: it is not {accept_name}",
        )
    return obj
