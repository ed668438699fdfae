"""The keyed-store marker: a store knows that it is keyed, and with which key.

A keyed store writes ``<root>/keyed`` the first time it writes anything: one line
of JSON and a line holding its HMAC (see
:meth:`~afk_local.storage.format.integrity.Signer.sign_document`).
With it,

- a process *without* the key sees that the store is keyed, so it refuses to write
  into it or to execute anything it names (an unsigned ``run.meta`` planted there is
  never run), and read-only commands warn that signatures go unchecked;
- a process with *another* key is told so at once, instead of finding every file
  "damaged".

Deleting the marker does not make a store unkeyed for this user: the store's head
records (:mod:`afk_local.storage.rundir.heads`), kept outside it, say the same.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from afk_local.storage import fsio
from afk_local.storage.format.integrity import Signer, split_document
from afk_local.storage.format.records import now_ms

MARKER_NAME = "keyed"
"""The marker's file name in the store's root."""

_TAG = "afk-local/keyed-store"
_FORMAT = "afk-local-keyed-store"


class KeyedMarker(msgspec.Struct, kw_only=True, frozen=True):
    """What the marker says."""

    format: str = _FORMAT
    version: int = 1
    created_ms: int = 0


def marker_path(root: str | os.PathLike[str]) -> Path:
    """``<root>/keyed``."""
    return Path(root) / MARKER_NAME


def marker_exists(root: str | os.PathLike[str]) -> bool:
    """True when the store at ``root`` has a keyed marker (whatever its content)."""
    return os.path.lexists(marker_path(root))


def check_marker(root: str | os.PathLike[str], signer: Signer) -> str | None:
    """Why the marker at ``root`` does not vouch for ``signer``'s key; None when it does
    (or when there is no marker yet)."""
    path = marker_path(root)
    try:
        data = fsio.read_bounded(path, 4096)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        return f"{path}: cannot read the keyed-store marker: {exc}"
    if split_document(data)[1] is None:
        return f"{path}: the keyed-store marker is not signed"
    try:
        msgspec.json.decode(signer.open_document(_TAG, data), type=KeyedMarker)
    except (ValueError, msgspec.DecodeError, msgspec.ValidationError):
        return (
            f"{path}: this store was keyed with another key (its marker does not verify "
            "with this one): use the store's own AFK_LOCAL_KEY"
        )
    return None


def write_marker(
    root: str | os.PathLike[str], signer: Signer, env: fsio.Env = fsio.DEFAULT_ENV
) -> None:
    """Write the marker of a keyed store at ``root`` unless it has one (through ``env``)."""
    path = marker_path(root)
    if os.path.lexists(path):
        return
    env.make_dirs(path.parent)
    body = msgspec.json.encode(KeyedMarker(created_ms=now_ms()))
    env.atomic_write(path, signer.sign_document(_TAG, body))


__all__ = [
    "MARKER_NAME",
    "KeyedMarker",
    "check_marker",
    "marker_exists",
    "marker_path",
    "write_marker",
]
