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
records (:mod:`afk_local.storage.rundir.read.heads`), kept outside it, say the same.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from afk_local.errors import KeyRequiredError, UntrustedStoreError
from afk_local.storage import fsio
from afk_local.storage.format.integrity import Signer, split_document
from afk_local.storage.format.records import now_ms
from afk_local.storage.rundir.read.heads import store_dir

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


def known_keyed(root: str | os.PathLike[str], head_dir: str | os.PathLike[str]) -> bool:
    """True when the store at ``root`` says it is keyed: its marker, or head records kept
    for it under ``head_dir``."""
    return marker_exists(root) or store_dir(root, head_dir).is_dir()


def key_problem(
    root: str | os.PathLike[str], head_dir: str | os.PathLike[str], signer: Signer | None
) -> str | None:
    """Why a process with ``signer`` (None: no key) may not write into (or execute from)
    the store at ``root``; None when it may."""
    if signer is None:
        if known_keyed(root, head_dir):
            return (
                f"{root} is a keyed store (see {marker_path(root)}) and this "
                "process has no key: set AFK_LOCAL_KEY (or pass Store(key=...))"
            )
        return None
    return check_marker(root, signer)


def prepare_write(
    root: str | os.PathLike[str],
    head_dir: str | os.PathLike[str],
    signer: Signer | None,
    run_id: str = "",
    env: fsio.Env = fsio.DEFAULT_ENV,
) -> None:
    """Check that a process with ``signer`` may write into the store and, if keyed, mark it
    (through the store's I/O seam ``env``).

    Raises:
        KeyRequiredError: a keyed store opened without the key.
        UntrustedStoreError: a keyed store opened with another key.
    """
    problem = key_problem(root, head_dir, signer)
    if problem is not None:
        if signer is None:
            raise KeyRequiredError(run_id, str(marker_path(root)), keyed_store=True)
        raise UntrustedStoreError(
            str(marker_path(root)), problem, "use the store's own key", run_id or None
        )
    if signer is not None:
        write_marker(root, signer, env)


__all__ = [
    "MARKER_NAME",
    "KeyedMarker",
    "check_marker",
    "key_problem",
    "known_keyed",
    "marker_exists",
    "marker_path",
    "prepare_write",
    "write_marker",
]
