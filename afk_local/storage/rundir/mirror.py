"""The seam between a run's writer and a remote mirror (``Store(root, mirror=URL)``).

The storage layer never imports a mirror's implementation (it needs a third-party
object-store client, DESIGN §2 and §10). It declares what a writer tells a mirror
(:class:`RunMirror`) and finds the implementation for a URL at run time through the
``afk_local.mirrors`` entry-point group: one entry per URL scheme, naming a callable
``(url, *, root) -> Mirror``. afk_local's own ``remote`` extra registers ``s3``,
``gs``, ``az`` and ``file`` (docs/remote.md); another package may register more.

A writer notifies its :class:`RunMirror` only after a record is acknowledged locally,
and a notification only enqueues: the local durability path never waits on the network.

A run whose lease another store took is *fenced* on this machine: the mirror (or
``push``) leaves a ``fenced`` marker in the run directory (:func:`mark_fenced`), and
opening the run for writing refuses it (:func:`refuse_fenced`) until ``pull --take``
replaces the local copy. The marker is local, so it holds without the mirror set.

Example:
    >>> from afk_local.storage.rundir.mirror import mirror_scheme
    >>> mirror_scheme("s3://bucket/afk")
    's3'
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Protocol

import msgspec

from afk_local.errors import LeaseLostError, MirrorError
from afk_local.storage import fsio
from afk_local.storage.format.codec import RecordCodec
from afk_local.storage.format.layout import RunPaths

MIRROR_ENV = "AFK_LOCAL_MIRROR"
"""The mirror URL a :class:`~afk_local.Store` uses when none is passed (``mirror=None``)."""

ENTRY_POINT_GROUP = "afk_local.mirrors"
"""The entry-point group that maps a URL scheme to a mirror implementation."""

REMOTE_COPY_KEY = "remote_copy"
"""``run.meta`` extra of a run pulled without ``--take``: a read-only copy no writer opens."""

FENCED_NAME = "fenced"
"""The marker a run directory holds once another store took the run's lease."""

_MAX_FENCED_BYTES = 64 << 10

REMOTE_EXTRA_HINT = "install the remote extra: pip install 'afk_local[remote]'"

_SCHEME = re.compile(r"^([a-z][a-z0-9+.-]{0,31})://")


class RunMirror(Protocol):
    """What a run's writer tells its mirror; every call but :meth:`flush` only enqueues."""

    def published(self, name: str) -> None:
        """An immutable run file (a checkpoint, a pack) is durable under ``name``."""

    def meta_replaced(self) -> None:
        """``run.meta`` was replaced durably."""

    def before_append(self) -> None:
        """About to append to ``effects.log``: raise if the run may no longer be written."""

    def synced(self, end: int) -> None:
        """``effects.log`` is durable up to byte ``end``."""

    def appended(self, end: int) -> None:
        """A record ending at byte ``end`` is durable locally; the appending thread waits
        here when the mirror keeps effects remote-durable (raising fails the append)."""

    def check(self) -> None:
        """Raise the error that stops this run's writer (:class:`~afk_local.LeaseLostError`)."""

    def flush(self, timeout: float) -> None:
        """Return once everything notified so far is uploaded; raise the mirror's error."""

    def uploaded_seq(self) -> int:
        """Every immutable file up to this seq is on the remote; never waits."""

    def close(self) -> None:
        """Upload what is pending (bounded), stop, and raise the mirror's error if any."""


class Mirror(Protocol):
    """A store's mirror: hands out one :class:`RunMirror` per run opened for writing."""

    url: str

    def attach(self, paths: RunPaths, record_codec: RecordCodec) -> RunMirror:
        """Start mirroring a run whose lock the caller holds; checks the run's lease.

        Raises:
            LeaseLostError: another store holds the run's lease.
        """

    def close(self) -> None:
        """Release what the mirror holds (connections); run mirrors close on their own."""


class MirrorFactory(Protocol):
    """What an ``afk_local.mirrors`` entry point loads."""

    def __call__(self, url: str, *, root: Path) -> Mirror:
        """A mirror of the store at ``root`` on ``url``."""


def mark_fenced(paths: RunPaths, url: str, detail: str) -> None:
    """Leave the fenced marker in the run directory (durably; idempotent)."""
    if not paths.dir.is_dir() or os.path.lexists(paths.dir / FENCED_NAME):
        return
    body = msgspec.json.encode({"url": url, "detail": detail[:2000]})
    fsio.atomic_write(paths.dir / FENCED_NAME, body)


def _fenced_url(paths: RunPaths) -> str | None:
    """The remote named by the run's fenced marker; None when there is no marker."""
    marker = paths.dir / FENCED_NAME
    if not os.path.lexists(marker):
        return None
    try:
        found = msgspec.json.decode(fsio.read_bounded(marker, _MAX_FENCED_BYTES))
        if isinstance(found, dict) and isinstance(found.get("url"), str):
            return str(found["url"])[:1000]
    except (OSError, ValueError):
        pass  # a damaged marker fences all the same
    return "its remote"


def fenced_reason(paths: RunPaths) -> str | None:
    """One line saying why the run may not be written here, when it holds the fenced
    marker; None otherwise."""
    url = _fenced_url(paths)
    if url is None:
        return None
    return (
        f"this copy is fenced: another store took the run's lease on {url}; take it back "
        f"with `afk-local pull {paths.run_id} --from {url} --take`"
    )


def refuse_fenced(paths: RunPaths) -> None:
    """Raise LeaseLostError (one line) when the run directory holds the fenced marker."""
    url = _fenced_url(paths)
    if url is not None:
        raise LeaseLostError(
            paths.run_id, url, "this copy is fenced (another store took the run's lease)"
        )


def mirror_scheme(url: str) -> str:
    """The scheme of a mirror URL (``s3``, ``gs``, ``az``, ``file``...); MirrorError if none."""
    match = _SCHEME.match(url)
    if match is None:
        raise MirrorError(url, "not a URL: expected s3://bucket/prefix, gs://, az:// or file:///")
    return match.group(1)


def open_mirror(url: str, root: Path) -> Mirror:
    """The mirror registered for ``url``'s scheme, for the store at ``root``.

    Raises:
        MirrorError: no implementation is registered for the scheme, or its extra
            (``afk_local[remote]``) is not installed.
    """
    scheme = mirror_scheme(url)
    import importlib.metadata  # noqa: PLC0415 - a store that mirrors nothing never needs it

    entries = [e for e in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)]
    entry = next((e for e in entries if e.name == scheme), None)
    if entry is None:
        known = ", ".join(sorted({e.name for e in entries})) or "none"
        raise MirrorError(
            url, f"no mirror for scheme {scheme!r} (registered: {known}); {REMOTE_EXTRA_HINT}"
        )
    try:
        factory: MirrorFactory = entry.load()
    except ImportError as exc:
        raise MirrorError(url, f"{exc}; {REMOTE_EXTRA_HINT}") from exc
    return factory(url, root=root)


__all__ = [
    "ENTRY_POINT_GROUP",
    "FENCED_NAME",
    "MIRROR_ENV",
    "REMOTE_COPY_KEY",
    "Mirror",
    "MirrorFactory",
    "RunMirror",
    "fenced_reason",
    "mark_fenced",
    "mirror_scheme",
    "open_mirror",
    "refuse_fenced",
]
