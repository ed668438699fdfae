"""Editing a checkpoint payload by path: what ``afk-local fork --set PATH=JSON`` applies.

Paths are those of ``afk-local inspect --path``: dotted dict keys and list
indexes into the payload (``state.total``, ``messages.3.content``). Every part
but the last must exist; the last may add a key to a dict (never an item to a
list). The payload is copied, never changed in place.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from typing import Any

from afk_local.errors import StateEditError


def parse_updates(settings: Iterable[str]) -> dict[str, Any]:
    """``PATH=JSON`` settings (``fork --set``, the page's fork form) as ``{path: value}``.

    The path is stripped of spaces; the value is JSON (a string needs its double
    quotes); a path given twice keeps its last value. Whether the state has the path
    is checked by :func:`apply_updates`, on the checkpoint.

    >>> parse_updates(["state.total=0", 'state.name="x"'])
    {'state.total': 0, 'state.name': 'x'}

    Raises:
        ValueError: a setting without ``=`` or without a path, or whose value is not JSON.
    """
    updates: dict[str, Any] = {}
    for setting in settings:
        path, sep, text = setting.partition("=")
        path = path.strip()
        if not sep or not path:
            raise ValueError(
                f'expected PATH=JSON (e.g. state.total=0 or state.name="x"), not {setting!r}'
            )
        try:
            updates[path] = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"the value of {path} is not JSON ({exc.msg} at column {exc.colno}): "
                f'numbers as they are, text in double quotes ({path}="text")'
            ) from None
    return updates


def apply_updates(payload: Any, updates: Mapping[str, Any], run_id: str) -> Any:
    """A copy of ``payload`` with each ``path: value`` of ``updates`` set.

    Raises:
        StateEditError: no payload (nothing to edit), an empty path, or a path
            whose parent does not exist or is not a dict or list.
    """
    if payload is None:
        raise StateEditError(
            run_id,
            "there is no runtime_state at or before that checkpoint, so no state to edit; "
            f"pick a later SEQ (`afk-local log {run_id}` lists them)",
        )
    edited = copy.deepcopy(payload)
    for path, value in updates.items():
        parts = path.split(".")
        if not path or not all(parts):
            raise StateEditError(run_id, f"bad path {path!r}: dotted keys like state.total")
        holder = edited
        walked = "payload"
        for part in parts[:-1]:
            holder = _child(holder, part, walked, run_id, path)
            walked += f".{part}"
        _assign(holder, parts[-1], value, (run_id, walked, path))
    return edited


def _child(holder: Any, part: str, walked: str, run_id: str, path: str) -> Any:
    if isinstance(holder, dict):
        for key in _keys(part):
            if key in holder:
                return holder[key]
        keys = ", ".join(sorted(map(str, holder))[:10])
        raise StateEditError(run_id, f"--set {path}: no {part!r} in {walked} (it has: {keys})")
    if isinstance(holder, list):
        return holder[_index(holder, part, walked, run_id, path)]
    raise StateEditError(
        run_id, f"--set {path}: {walked} is a {type(holder).__name__}, not a dict or list"
    )


def _assign(holder: Any, part: str, value: Any, where: tuple[str, str, str]) -> None:
    run_id, walked, path = where
    if isinstance(holder, dict):
        key: Any = part
        for candidate in _keys(part):
            if candidate in holder:
                key = candidate
                break
        holder[key] = value
    elif isinstance(holder, list):
        holder[_index(holder, part, walked, run_id, path)] = value
    else:
        raise StateEditError(
            run_id, f"--set {path}: {walked} is a {type(holder).__name__}, not a dict or list"
        )


def _keys(part: str) -> list[Any]:
    """A path part as a dict key: the text, and the integer it spells (msgpack keeps int keys)."""
    keys: list[Any] = [part]
    if part.lstrip("-").isdigit():
        keys.append(int(part))
    return keys


def _index(holder: list[Any], part: str, walked: str, run_id: str, path: str) -> int:
    if part.lstrip("-").isdigit() and -len(holder) <= int(part) < len(holder):
        return int(part)
    raise StateEditError(
        run_id, f"--set {path}: {walked} is a list of {len(holder)} items, no index {part!r}"
    )


__all__ = ["StateEditError", "apply_updates", "parse_updates"]
