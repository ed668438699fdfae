"""Every setting of a store and its writers in one typed object, and the one place that
reads their defaults from the environment.

A :class:`StoreOptions` travels from :class:`~afk_local.Store` to each run's writer
(``open_writer``) and to the operations the store runs; nothing below the store
reads ``os.environ``. ``StoreOptions()`` holds the built-in defaults only;
:meth:`StoreOptions.from_environ` starts from them and applies the ``AFK_LOCAL_*``
variables, which is what ``Store(root)`` does (docs/options.md lists them all).

Example:
    >>> import dataclasses
    >>> import afk_local as afk
    >>> options = dataclasses.replace(afk.StoreOptions.from_environ({}), max_chain=8)
    >>> store = afk.Store("/tmp/afk-doc-options", options=options)
    >>> store.options.max_chain, store.options.lock_timeout
    (8, 0.0)
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from afk_local.errors import InvalidStoreRootError
from afk_local.storage.format.codec import (
    DEFAULT_LEVEL,
    DEFAULT_MAX_RECORD_BYTES,
    DecHook,
    EncHook,
)
from afk_local.storage.format.integrity import KEY_ENV
from afk_local.storage.format.layout import DEFAULT_LOOSE_LIMIT
from afk_local.storage.fsio import DEFAULT_ENV, Env
from afk_local.storage.rundir.delta_policy import DEFAULT_DELTA_FRACTION, DEFAULT_MAX_CHAIN
from afk_local.storage.rundir.mirror import MIRROR_ENV, Mirror
from afk_local.storage.rundir.read.chain import MAX_READ_CHAIN
from afk_local.storage.rundir.read.heads import HEAD_DIR_ENV

ROOT_ENV = "AFK_LOCAL_ROOT"
"""Environment variable naming the store directory used when none is passed."""
DEFAULT_ROOT = ".afk"
"""The store directory when neither a root nor ``$AFK_LOCAL_ROOT`` is given."""
MAX_RECORD_BYTES_ENV = "AFK_LOCAL_MAX_RECORD_BYTES"
"""Environment variable giving ``max_record_bytes`` to stores made without one (the CLI,
the watcher and its children), so every process of a store uses the same bound."""


@dataclass(frozen=True, kw_only=True)
class StoreOptions:
    """Every setting of a :class:`~afk_local.Store` and of the writers it opens.

    Frozen: change one with ``dataclasses.replace(options, max_chain=8)``. The field
    defaults are the built-in ones; :meth:`from_environ` applies the environment.

    Raises:
        ValueError: a setting is out of its range (``max_chain`` over 1024...).
    """

    enc_hook: EncHook | None = None
    """msgspec hook turning a custom payload type into builtins (never pickle)."""
    dec_hook: DecHook | None = None
    """msgspec hook turning builtins back into a custom payload type."""
    key: bytes | str | None = field(default=None, repr=False)
    """Secret that turns on tamper evidence (HMAC-SHA256 on every file and journal record)."""
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    """Largest decoded record written or read (at least 1)."""
    lock_timeout: float = 0.0
    """Seconds a writer waits for a run's ``owner.lock`` before RunLockedError."""
    max_chain: int = DEFAULT_MAX_CHAIN
    """Deltas after which a writer starts a new keyframe (0..1024; 0: keyframes only)."""
    delta_fraction: float = DEFAULT_DELTA_FRACTION
    """A delta over this fraction of an estimated full frame is written as a keyframe."""
    level: int = DEFAULT_LEVEL
    """zstd compression level of checkpoint frames."""
    pack_loose_limit: int | None = DEFAULT_LOOSE_LIMIT
    """Loose checkpoint files a writer keeps before packing the older ones; None or 0: never."""
    mirror: str | Mirror | None = None
    """Remote every written run is mirrored to: a URL or a Mirror; None or ``""``: none."""
    head_dir: str | os.PathLike[str] | None = None
    """Where a keyed store keeps its head records, outside the store; None: the state dir."""
    env: Env = DEFAULT_ENV
    """The I/O seam every write goes through (:class:`~afk_local.storage.fsio.Env`)."""

    def __post_init__(self) -> None:
        if not 0 <= self.max_chain <= MAX_READ_CHAIN:
            raise ValueError(f"max_chain must be 0..{MAX_READ_CHAIN}, not {self.max_chain}")
        if self.max_record_bytes < 1:
            raise ValueError(f"max_record_bytes must be >= 1, not {self.max_record_bytes}")
        if self.delta_fraction < 0:
            raise ValueError(f"delta_fraction must be >= 0, not {self.delta_fraction}")
        if self.pack_loose_limit is not None and self.pack_loose_limit < 0:
            raise ValueError(f"pack_loose_limit must be >= 0 or None, not {self.pack_loose_limit}")

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> StoreOptions:
        """The built-in defaults with the ``AFK_LOCAL_*`` variables of ``environ`` applied.

        ``environ`` defaults to ``os.environ``. Read: ``AFK_LOCAL_KEY`` (``key``),
        ``AFK_LOCAL_MAX_RECORD_BYTES`` (``max_record_bytes``), ``AFK_LOCAL_MIRROR``
        (``mirror``) and ``AFK_LOCAL_HEAD_DIR`` (``head_dir``); an empty variable
        counts as unset.

        Raises:
            ValueError: ``AFK_LOCAL_MAX_RECORD_BYTES`` is not a whole number >= 1.
        """
        environ = os.environ if environ is None else environ
        return cls(
            key=environ.get(KEY_ENV) or None,
            max_record_bytes=_max_record_bytes(environ),
            mirror=default_mirror_url(environ),
            head_dir=_env_head_dir(environ),
        )

    def resolved_head_dir(self, environ: Mapping[str, str] | None = None) -> Path:
        """``head_dir``, or the user's state directory's ``afk_local/heads`` when None."""
        if self.head_dir is not None:
            return Path(self.head_dir)
        return state_head_dir(environ)


def _max_record_bytes(environ: Mapping[str, str]) -> int:
    text = environ.get(MAX_RECORD_BYTES_ENV)
    if not text:
        return DEFAULT_MAX_RECORD_BYTES
    try:
        value = int(text)
    except ValueError:
        raise ValueError(
            f"{MAX_RECORD_BYTES_ENV}={text!r} is not a whole number of bytes"
        ) from None
    if value < 1:
        raise ValueError(f"{MAX_RECORD_BYTES_ENV} must be >= 1, not {value}")
    return value


def default_root(environ: Mapping[str, str] | None = None) -> Path:
    """``$AFK_LOCAL_ROOT`` if set, else ``./.afk`` (checked and ``~``-expanded as
    :func:`store_root` does)."""
    return store_root(None, environ)


def store_root(
    root: str | os.PathLike[str] | None, environ: Mapping[str, str] | None = None
) -> Path:
    """THE one reading of a store root, for Python and the command line alike.

    ``root`` if given, else ``$AFK_LOCAL_ROOT`` if set and not empty, else ``./.afk``;
    a leading ``~`` is expanded (``Store("~/.afk")``, ``AFK_LOCAL_ROOT='~/x'``).

    Raises:
        InvalidStoreRootError: the root is empty, only whitespace, or holds a line
            break or NUL: a mistake (a stray quote, a blank variable), never a directory
            to create.
    """
    environ = os.environ if environ is None else environ
    if root is not None:
        given, text = "the root given", os.fspath(root)
    elif environ.get(ROOT_ENV):
        given, text = ROOT_ENV, environ[ROOT_ENV]
    else:
        given, text = "the default", DEFAULT_ROOT
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if not text.strip() or any(c in text for c in "\n\r\0"):
        raise InvalidStoreRootError(text, given)
    return Path(text).expanduser()


def default_mirror_url(environ: Mapping[str, str] | None = None) -> str | None:
    """``$AFK_LOCAL_MIRROR`` when set and not empty."""
    environ = os.environ if environ is None else environ
    return environ.get(MIRROR_ENV) or None


def state_head_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The user's state directory's ``afk_local/heads`` (``$XDG_STATE_HOME``, else
    ``~/.local/state``; ``~/Library/Application Support`` on macOS)."""
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "afk_local" / "heads"
    environ = os.environ if environ is None else environ
    state = environ.get("XDG_STATE_HOME")
    base = Path(state).expanduser() if state else Path.home() / ".local" / "state"
    return base / "afk_local" / "heads"


def _env_head_dir(environ: Mapping[str, str]) -> Path | None:
    configured = environ.get(HEAD_DIR_ENV)
    return Path(configured).expanduser() if configured else None


__all__ = [
    "DEFAULT_DELTA_FRACTION",
    "DEFAULT_MAX_CHAIN",
    "DEFAULT_ROOT",
    "MAX_RECORD_BYTES_ENV",
    "ROOT_ENV",
    "StoreOptions",
    "default_mirror_url",
    "default_root",
    "state_head_dir",
]
