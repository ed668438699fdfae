"""Store identity: a store knows its id and the directory it lives in.

The first write into a store records ``<root>/identity``: one line of JSON holding a
random store id and the absolute, resolved path of the root, and in a keyed store a
second line holding its HMAC (like the keyed marker, :mod:`afk_local.storage.store_key`).
A store that was copied (``cp -a``, ``rsync``, a restored ``tar``) or moved keeps the
file, so its recorded path no longer names the directory it is read from: the trust
gate (:func:`afk_local.storage.trust.require_trusted_run`) then refuses to run
anything from it, because its runs' recorded working directories and scripts still
point at the old place, where a resume would repeat their side effects.
``afk-local adopt`` (:func:`adopt_identity`) makes the new directory the store's home.

A store written before identities existed gets one on its next write, without
complaint: a copy made before that write cannot be told from the original.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import msgspec

from afk_local.errors import StoreMovedError, UntrustedStoreError
from afk_local.storage import fsio
from afk_local.storage.format.integrity import Signer, split_document
from afk_local.storage.format.records import now_ms

IDENTITY_NAME = "identity"
"""The identity file's name in the store's root."""

MAX_IDENTITY_BYTES = 8192
"""The largest identity file read (it is about 200 bytes)."""

_TAG = "afk-local/store-identity"
_FORMAT = "afk-local-store-identity"


class StoreIdentity(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=False):
    """What ``<root>/identity`` says (docs/format.md, "Store identity")."""

    format: str = _FORMAT
    version: int = 1
    store_id: str
    """32 hex digits, random, made when the store was first written."""
    path: str
    """The absolute, resolved path of the store's root when it was created or adopted."""
    created_ms: int = 0
    adopted_ms: int = 0
    """When ``afk-local adopt`` last re-homed the store (0: never)."""
    adopted_from: str | None = None
    """The path recorded before the last adoption."""
    adopted_project: bool = False
    """Whether the last adoption re-homed the runs' recorded paths (the project moved too)."""


def identity_path(root: str | os.PathLike[str]) -> Path:
    """``<root>/identity``."""
    return Path(root) / IDENTITY_NAME


def home_of(root: str | os.PathLike[str]) -> str:
    """The path a store at ``root`` records as its home: absolute, symlinks resolved."""
    return os.path.realpath(os.path.abspath(root))


def _encode(identity: StoreIdentity, signer: Signer | None) -> bytes:
    body = msgspec.json.encode(identity)
    return body + b"\n" if signer is None else signer.sign_document(_TAG, body)


def read_identity(root: str | os.PathLike[str], signer: Signer | None) -> StoreIdentity | None:
    """The identity of the store at ``root``; None when it has none yet.

    Raises:
        UntrustedStoreError: the file is not a small regular file, is not valid, or in a
            keyed store is unsigned or signed with another key.
    """
    path = identity_path(root)
    try:
        data = fsio.read_bounded(path, MAX_IDENTITY_BYTES)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise UntrustedStoreError(
            str(path), f"cannot read the store's identity: {exc}", _REPAIR
        ) from None
    body, _ = split_document(data)
    if signer is not None:
        try:
            body = signer.open_document(_TAG, data)
        except ValueError as exc:
            raise UntrustedStoreError(
                str(path), f"the store's identity does not verify: {exc}", _REPAIR
            ) from None
    try:
        identity = msgspec.json.decode(body, type=StoreIdentity)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise UntrustedStoreError(
            str(path), f"the store's identity is not valid ({exc})", _REPAIR
        ) from None
    if identity.format != _FORMAT or not os.path.isabs(identity.path):
        raise UntrustedStoreError(
            str(path), "the store's identity is not valid (format or path)", _REPAIR
        )
    return identity


_REPAIR = "run `afk-local adopt` in this store to record a new one"


def ensure_identity(
    root: str | os.PathLike[str], signer: Signer | None, env: fsio.Env = fsio.DEFAULT_ENV
) -> None:
    """Give the store at ``root`` an identity unless it has one: create-only, 0600, atomic.

    Two processes racing both publish with a hard link, which never replaces: the
    first one wins and the other's is dropped.
    """
    path = identity_path(root)
    if os.path.lexists(path):
        return
    identity = StoreIdentity(store_id=os.urandom(16).hex(), path=home_of(root), created_ms=now_ms())
    env.make_dirs(path.parent)
    tmp = fsio.temp_path(path.parent, IDENTITY_NAME)
    try:
        env.write_new_file(tmp, _encode(identity, signer))
        with contextlib.suppress(FileExistsError):
            env.hard_link(tmp, path)
    finally:
        env.unlink(tmp)
    env.fsync_dir(path.parent)


def home_problem(root: str | os.PathLike[str], signer: Signer | None) -> str | None:
    """The path the store at ``root`` was created at, when it is not ``root`` (it was
    copied or moved); None when it is at home or has no identity yet."""
    identity = read_identity(root, signer)
    if identity is None or identity.path == home_of(root):
        return None
    return identity.path


def require_home(root: str | os.PathLike[str], signer: Signer | None, run_id: str = "") -> None:
    """Refuse to run anything from a store that was copied or moved.

    Raises:
        StoreMovedError: the store's identity records another path.
        UntrustedStoreError: the identity file is damaged.
    """
    recorded = home_problem(root, signer)
    if recorded is not None:
        raise StoreMovedError(str(identity_path(root)), home_of(root), recorded, run_id or None)


class HomeCheck:
    """:func:`home_problem` for one store, re-read only when its identity file changed.

    Every entry that continues a run asks it once per open; a ``stat`` of the identity
    file decides whether the answer it read last time still holds, so the hot path
    costs one system call, never a read per checkpoint.
    """

    def __init__(self) -> None:
        self._seen: tuple[int, int, int, int, str] | None = None
        self._answer: str | None = None

    def moved_from(self, root: str | os.PathLike[str], signer: Signer | None) -> str | None:
        """The path the store at ``root`` was created at when it is not ``root``; else None."""
        try:
            st = os.stat(identity_path(root), follow_symlinks=False)
        except OSError:
            self._seen = None
            return home_problem(root, signer)  # absent, or refused with a reason
        seen = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size, os.path.abspath(root))
        if seen != self._seen:
            self._answer = home_problem(root, signer)
            self._seen = seen
        return self._answer

    def require(
        self, root: str | os.PathLike[str], signer: Signer | None, run_id: str = ""
    ) -> None:
        """Refuse to continue a run from a store that was copied or moved.

        Raises:
            StoreMovedError: the store's identity records another path.
            UntrustedStoreError: the identity file is damaged.
        """
        recorded = self.moved_from(root, signer)
        if recorded is not None:
            raise StoreMovedError(str(identity_path(root)), home_of(root), recorded, run_id or None)


def adopt_identity(
    root: str | os.PathLike[str],
    signer: Signer | None,
    env: fsio.Env = fsio.DEFAULT_ENV,
    *,
    project_moved: bool = False,
    moved_from: str | None = None,
) -> tuple[str | None, StoreIdentity]:
    """Record ``root`` as the store's home (replacing the identity atomically).

    ``project_moved`` records whether the runs' paths were re-homed too; ``moved_from``
    names the old home when the store is at home already and only that changes (a
    second adoption that re-homes the project after all).

    Returns the path recorded before (None when the store had no identity or was
    already at home) and the new identity. The store id is kept.
    """
    old = read_identity(root, signer)
    here = home_of(root)
    if old is not None and old.path == here and (moved_from is None or not project_moved):
        return None, old
    new = StoreIdentity(
        store_id=old.store_id if old is not None else os.urandom(16).hex(),
        path=here,
        created_ms=old.created_ms if old is not None else now_ms(),
        adopted_ms=now_ms(),
        adopted_from=moved_from
        if old is not None and old.path == here
        else (old.path if old is not None else None),
        adopted_project=project_moved,
    )
    env.make_dirs(Path(root))
    env.atomic_write(identity_path(root), _encode(new, signer))
    return (old.path if old is not None else None), new


__all__ = [
    "IDENTITY_NAME",
    "MAX_IDENTITY_BYTES",
    "HomeCheck",
    "StoreIdentity",
    "adopt_identity",
    "ensure_identity",
    "home_of",
    "home_problem",
    "identity_path",
    "read_identity",
    "require_home",
]
