"""Old module paths, kept working for one release after the runner, the CLI and the run
directory were split into rooms (docs/architecture.md).

An old path still imports: it warns (DeprecationWarning) and
gives the module at its new path, the same object, so a patch through either name
patches both. Only paths are kept here; every public name stays ``afk_local.X``.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import types
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from importlib.abc import Loader

_ROOMS: dict[str, dict[str, tuple[str, ...]]] = {
    "afk_local.runner": {
        "operations": ("adopt", "cancel", "settle", "restart", "resume", "reentry", "replay_run"),
        "run": (
            "durable_function",
            "run_context",
            "attempt",
            "current",
            "replay",
            "state_checkpoint",
            "tags",
            "answers",
            "stopping",
            "script_exit",
            "loops",
        ),
        "time": ("durable_time", "sleeps", "retry", "limits"),
        "observe": ("observe", "progress", "run_report"),
        "code": ("entrypoints", "origin", "versions"),
    },
    "afk_local.cli": {
        "commands": (
            "read",
            "write",
            "manage",
            "repair",
            "replay",
            "schedule",
            "watch",
            "remote",
            "ui",
            "metrics",
            "listing",
            "demo",
        ),
    },
    "afk_local.storage.rundir": {
        "read": ("catalog", "chain", "reader", "heads", "verify", "metrics"),
        "write": (
            "writer",
            "publisher",
            "pack_trigger",
            "meta_keeper",
            "writer_journal",
            "lifetime",
            "creation",
        ),
    },
}
"""Each package that was split, its rooms and the modules each room took."""

MOVED: dict[str, str] = {
    f"{package}.{module}": f"{package}.{room}.{module}"
    for package, rooms in _ROOMS.items()
    for room, modules in rooms.items()
    for module in modules
}
"""Each old module path and its new one."""


class _MovedModules:
    """Finds a moved module under its old path and hands out the module at its new one.

    A meta path finder and loader by protocol (``find_spec``, ``create_module``,
    ``exec_module``): subclassing ``importlib.abc``'s would import ``importlib.resources``
    and with it pathlib and tempfile into every ``import afk_local``."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        """A spec for an old path (None for every other name)."""
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, cast("Loader", self))

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        """The module at its new path (imported now), which the old name then points at."""
        new = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} moved to {new}; the old path goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(new)

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: the module was imported at its new path."""


def install() -> None:
    """Let the old paths of :data:`MOVED` import (once per process)."""
    if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
        sys.meta_path.append(_MovedModules())
