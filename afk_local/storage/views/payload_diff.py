"""What changed between two checkpoint payloads: paths added, removed and changed.

``afk-local diff RUN SEQ_A SEQ_B`` prints it and the web page (``afk-local ui``) shows it.
"""

from __future__ import annotations

from typing import Any

from afk_local.storage.format.values import plain as to_jsonable


def structural_diff(a: Any, b: Any) -> dict[str, Any]:
    """Paths added, removed and changed from ``a`` to ``b`` (dicts by key, lists by index)."""
    result: dict[str, Any] = {"added": {}, "removed": {}, "changed": {}}
    _walk(a, b, "", result)
    return result


def _walk(a: Any, b: Any, path: str, out: dict[str, Any]) -> None:
    def sub(key: Any) -> str:
        return f"{path}.{key}" if path else str(key)

    if isinstance(a, dict) and isinstance(b, dict):
        for key in a:
            if key not in b:
                out["removed"][sub(key)] = to_jsonable(a[key])
            else:
                _walk(a[key], b[key], sub(key), out)
        for key in b:
            if key not in a:
                out["added"][sub(key)] = to_jsonable(b[key])
        return
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        for index in range(min(len(a), len(b))):
            _walk(a[index], b[index], sub(index), out)
        for index in range(len(b), len(a)):
            out["removed"][sub(index)] = to_jsonable(a[index])
        for index in range(len(a), len(b)):
            out["added"][sub(index)] = to_jsonable(b[index])
        return
    if type(a) is not type(b) or a != b:
        out["changed"][path or "(payload)"] = [to_jsonable(a), to_jsonable(b)]


__all__ = ["structural_diff"]
