"""The store's owner id: who holds a run's lease is a store, not a host or a process.

``<root>/store.id`` holds 32 random hex digits, made once (create-only, durable) the
first time a store touches a remote. Two stores on one machine are two owners; a
store copied elsewhere with ``rsync`` keeps its id, so copy a store only to move it.

Example:
    >>> import tempfile
    >>> sid = store_id(tempfile.mkdtemp())
    >>> len(sid)
    32
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

from afk_local.storage import fsio

STORE_ID_FILE = "store.id"
_STORE_ID = re.compile(r"[0-9a-f]{32}")


def is_store_id(text: str) -> bool:
    """True for a well-formed store id (32 lowercase hex digits)."""
    return _STORE_ID.fullmatch(text) is not None


def store_id(root: str | os.PathLike[str]) -> str:
    """The id of the store at ``root``, made on first use.

    Raises:
        ValueError: ``store.id`` exists but does not hold an id.
    """
    path = Path(root) / STORE_ID_FILE
    try:
        found = _read(path)
    except FileNotFoundError:
        fsio.make_dirs(path.parent)
        tmp = fsio.temp_path(path.parent, STORE_ID_FILE)
        fsio.write_new_file(tmp, (secrets.token_hex(16) + "\n").encode())
        try:
            fsio.hard_link(tmp, path)  # create-only: of two racing processes, one id wins
        except FileExistsError:
            pass
        finally:
            fsio.unlink(tmp)
        found = _read(path)
    # Durable before anything uses it, whoever made it: the process that linked it may
    # have been killed before its directory fsync (or be about to make it), and an id a
    # lease names must not be lost to a power cut (the store would get a second one).
    fsio.fsync_dir(path.parent)
    return found


def existing_store_id(root: str | os.PathLike[str]) -> str | None:
    """The id of the store at ``root`` if it has one (never makes one)."""
    try:
        return _read(Path(root) / STORE_ID_FILE)
    except (FileNotFoundError, ValueError):
        return None


def _read(path: Path) -> str:
    text = fsio.read_bounded(path, 256).decode("ascii", "replace").strip()
    if not is_store_id(text):
        raise ValueError(f"{path} does not hold a store id (32 hex digits): remove it")
    return text


__all__ = ["STORE_ID_FILE", "existing_store_id", "is_store_id", "store_id"]
