"""Head records: rollback protection for keyed stores, kept outside the store (docs/security.md).

Nothing inside a run can tell "never written" from "removed": a run whose newest
checkpoints were deleted, or a whole run directory put back from an older copy,
verifies. So a keyed store keeps, for every run, a small signed *head record*
somewhere the store's attacker cannot write (the user's state directory by
default), in the spirit of TUF's timestamp and snapshot roles. It names how far the
run got: the newest checkpoint's seq and MAC, the length of ``effects.log`` and the
MAC of its last record, and the ``updated_ms`` of the newest ``run.meta``. Every
acknowledged write moves it forward; :meth:`HeadStore.behind` compares a run with
its head, and a run behind its head has been rolled back.

The head is written after the write it describes is durable (a checkpoint that
carries a meta counts for that meta), with no fsync of its own (anchored by temp file
and rename when a writer opens the run, then rewritten in place as one fixed-size
``pwrite``): a crash, or a power loss, can only leave it *behind* the run, which is
never reported, or cut short, when it no longer verifies and counts as absent until the
next writer anchors it again; it is never ahead. The one exception runs the other way:
before gc rewrites a run (trims its journal, rewrites or deletes checkpoints), the head
is narrowed to what the rewrite keeps, durably (:meth:`HeadStore.loosen`), since the
rewrite would otherwise leave the old head ahead of it.

Layout: ``<head dir>/<store id>/<run_id>.head``, where ``<head dir>`` is
``$AFK_LOCAL_HEAD_DIR``, else ``$XDG_STATE_HOME/afk_local/heads``, else
``~/.local/state/afk_local/heads`` (``~/Library/Application Support/afk_local/heads``
on macOS), and ``<store id>`` names the store's real path. A store that has such a
directory is known to be keyed even if its in-store marker is removed.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path

import msgspec

from afk_local.errors import CheckpointCorruptionError, RunRolledBackError
from afk_local.storage import fsio
from afk_local.storage.format.integrity import MAC_SIZE, Signer
from afk_local.storage.format.layout import RunPaths, scan_checkpoints, validate_run_id
from afk_local.storage.format.records import now_ms
from afk_local.storage.rundir.read.catalog import RunCatalog
from afk_local.storage.rundir.read.chain import read_link_value

log = logging.getLogger("afk_local")

HEAD_DIR_ENV = "AFK_LOCAL_HEAD_DIR"
"""Environment variable naming the directory of head records (outside every store)."""

HEAD_SUFFIX = ".head"
_TAG = "afk-local/head"
_MAX_HEAD_BYTES = 4096
_PADDED_SIZE = 1024  # heads are rewritten in place: padding keeps every version this long


class Head(msgspec.Struct, kw_only=True, frozen=True):
    """How far a run got, as its last acknowledged writes left it."""

    run_id: str
    seq: int = 0
    """The newest checkpoint written (0: none yet)."""
    mac: str = ""
    """Hex MAC trailer of checkpoint ``seq``."""
    journal_bytes: int = 0
    """Durable length of ``effects.log``."""
    journal_mac: str = ""
    """Hex of the (up to) 32 bytes before ``journal_bytes``: the last record's MAC."""
    meta_updated_ms: int = 0
    """``updated_ms`` of the newest ``run.meta`` (strictly increasing per run)."""
    written_ms: int = 0


def store_id(root: str | os.PathLike[str]) -> str:
    """A directory name for a store: its base name and a digest of its real path."""
    real = os.path.realpath(root)
    name = re.sub(r"[^A-Za-z0-9._-]", "_", os.path.basename(real) or "root")[:40]
    digest = hashlib.blake2b(real.encode(), digest_size=10).hexdigest()
    return f"{name}-{digest}"


def store_dir(root: str | os.PathLike[str], head_dir: str | os.PathLike[str]) -> Path:
    """Where the head records of the store at ``root`` live."""
    return Path(head_dir) / store_id(root)


class HeadStore:
    """The head records of one keyed store.

    Args:
        root: the store's root directory.
        head_dir: the directory of head records (``StoreOptions.head_dir``, resolved).
        signer: the store's key; heads are signed with it.
    """

    def __init__(
        self, root: str | os.PathLike[str], head_dir: str | os.PathLike[str], signer: Signer
    ) -> None:
        self._root = root
        self._head_dir = head_dir
        self._dir: Path | None = None
        self._signer = signer

    @property
    def dir(self) -> Path:
        """This store's directory of head records (the store's real path, resolved once)."""
        if self._dir is None:
            self._dir = store_dir(self._root, self._head_dir)
        return self._dir

    def __repr__(self) -> str:
        return f"HeadStore(dir={str(self.dir)!r})"

    def path(self, run_id: str) -> Path:
        """The head record file of ``run_id``."""
        return self.dir / f"{validate_run_id(run_id)}{HEAD_SUFFIX}"

    def read(self, run_id: str) -> Head | None:
        """The head of ``run_id``; None when it has none.

        Raises:
            ValueError: the head record is unreadable or its MAC does not match.
        """
        path = self.path(run_id)
        try:
            data = fsio.read_bounded(path, _MAX_HEAD_BYTES)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ValueError(f"head record {path}: cannot read: {exc.strerror}") from None
        try:
            head = msgspec.json.decode(self._signer.open_document(_TAG, data), type=Head)
        except (ValueError, msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise ValueError(f"head record {path}: {exc}") from None
        if head.run_id != run_id:
            raise ValueError(f"head record {path} names run {head.run_id!r}")
        return head

    def write(self, head: Head) -> None:
        """Publish ``head`` (temp file and rename; no fsync: a lost head only lags)."""
        fsio.make_dirs_unsynced(self.dir)
        fsio.replace_unsynced(self.path(head.run_id), self.document(head))

    def document(self, head: Head) -> bytes:
        """The signed bytes of ``head``, padded to a fixed size (rewritten in place)."""
        body = msgspec.json.encode(msgspec.structs.replace(head, written_ms=now_ms()))
        data = self._signer.sign_document(_TAG, body)
        return data + b" " * max(_PADDED_SIZE - len(data), 0)

    def open_for_updates(self, run_id: str) -> int:
        """A descriptor on ``run_id``'s head record for :class:`HeadKeeper`'s in-place updates."""
        return fsio.open_regular(self.path(run_id), os.O_RDWR)

    def remove(self, run_id: str) -> None:
        """Forget the head of a run that was deleted on purpose."""
        fsio.remove_unsynced(self.path(run_id))

    def anchor(self, paths: RunPaths, meta_updated_ms: int) -> Head:
        """Record the run as it is on disk now as its head, and return it.

        Only for a run its caller holds the lock of and has checked (or just made):
        anchoring a rolled-back run would make the rollback its new truth.
        """
        head = Head(run_id=paths.run_id, meta_updated_ms=meta_updated_ms)
        head = with_disk_checkpoint(head, paths)
        head = with_disk_journal(head, paths)
        self.write(head)
        return head

    def loosen(self, run_id: str, meta_updated_ms: int) -> None:
        """Before a rewrite that may change what the head names (gc trims the journal,
        rewrites kept deltas, deletes checkpoints): keep only the ``run.meta`` mark, which
        the rewrite leaves as it is. A crash before the rewrite's :meth:`anchor` then
        leaves the head behind the run (less to compare), never ahead of it: so this
        head's rename is made durable (an fsync of its directory) before the rewrite
        starts; an unsynced one could be lost while the rewrite's files stay. Its bytes
        need no fsync: a head cut short does not verify and counts as absent."""
        fsio.make_dirs_unsynced(self.dir)
        head = Head(run_id=run_id, meta_updated_ms=meta_updated_ms)
        fsio.atomic_write(self.path(run_id), self.document(head), sync_file=False)

    def update_meta(self, run_id: str, meta_updated_ms: int) -> None:
        """Move the head's ``run.meta`` mark forward (another process wrote the meta)."""
        try:
            head = self.read(run_id)
        except ValueError:
            head = None
        if head is None:
            return  # no head yet: the run's next writer anchors one
        if meta_updated_ms > head.meta_updated_ms:
            self.write(msgspec.structs.replace(head, meta_updated_ms=meta_updated_ms))

    def require_not_behind(
        self, paths: RunPaths, meta_updated_ms: Callable[[], int | None]
    ) -> None:
        """Raise :class:`RunRolledBackError` when the run is behind its head record
        (``meta_updated_ms`` as for :meth:`behind`)."""
        behind = self.behind(paths, meta_updated_ms)
        if behind:
            raise RunRolledBackError(
                str(paths.dir),
                "rolled back: " + "; ".join(behind),
                "restore the run from a backup, or, if you put this copy back yourself, "
                f"accept it with `afk-local resume {paths.run_id} --trust`",
                paths.run_id,
            )

    def behind(self, paths: RunPaths, meta_updated_ms: Callable[[], int | None]) -> list[str]:
        """Why the run at ``paths`` is behind its head (rolled back); empty when it is not.

        ``meta_updated_ms`` reads the ``updated_ms`` of the run's current ``run.meta``
        (None: unreadable). It is called after the head record is read, as the run's
        checkpoints and journal are looked at after it: a writer only ever moves the run
        first and its head after, so what is read after the head is never behind it
        unless the run was rolled back. (Read before it, a meta another process replaced
        meanwhile would look older than the head that process then moved.) A run without
        a head record is not behind: it has nothing to compare with.
        """
        try:
            head = self.read(paths.run_id)
        except ValueError as exc:
            # Nobody but this user writes the head directory: a head that does not verify
            # is a crash cutting its unsynced write short, not an attack. Not comparable.
            log.warning(
                "run %s: %s; rollback not checked until the run is written", paths.run_id, exc
            )
            return []
        if head is None:
            return []
        found: list[str] = []
        if head.seq:
            current = {f.seq: f.name for f in scan_checkpoints(paths.dir)}
            name = current.get(head.seq)
            mac = read_link_value(str(paths.dir / name)) if name is not None else None
            if mac is None:  # not loose (or gone meanwhile): packed? (the MAC is the entry's)
                catalog = RunCatalog(paths)
                try:
                    packed = catalog.packed(head.seq)
                    mac = None if packed is None else catalog.link_value(packed)
                    name = None if packed is None else packed.name
                except CheckpointCorruptionError:
                    mac = None
            if mac is None:
                newest = max((f.seq for f in catalog.files()), default=0)
                found.append(
                    f"checkpoint {head.seq} was written and acknowledged, but the newest on disk "
                    f"is {newest}: checkpoints were deleted or an older copy of the run put back"
                )
            elif mac.hex() != head.mac:
                found.append(
                    f"{name} is not the checkpoint {head.seq} that was acknowledged "
                    "(an older copy put back)"
                )
        if head.journal_bytes:
            size, tail = _journal_tail(paths, head.journal_bytes)
            if size < head.journal_bytes:
                found.append(
                    f"effects.log has {size} bytes, {head.journal_bytes} were acknowledged: "
                    "records were cut off or an older copy put back"
                )
            elif tail.hex() != head.journal_mac:
                found.append(
                    "effects.log does not hold the records that were acknowledged "
                    "(an older or other copy put back)"
                )
        meta_ms = meta_updated_ms()
        if meta_ms is not None and meta_ms < head.meta_updated_ms:
            found.append(
                f"run.meta is older (updated_ms {meta_ms}) than the newest one written "
                f"({head.meta_updated_ms}): an older copy was put back"
            )
        return found


def with_disk_checkpoint(head: Head, paths: RunPaths) -> Head:
    """``head`` naming the newest checkpoint file on disk."""
    files = scan_checkpoints(paths.dir)
    if not files:
        return msgspec.structs.replace(head, seq=0, mac="")
    mac = read_link_value(str(paths.dir / files[-1].name)) or b""
    return msgspec.structs.replace(head, seq=files[-1].seq, mac=mac.hex())


def with_disk_journal(head: Head, paths: RunPaths) -> Head:
    """``head`` naming ``effects.log`` as it is on disk."""
    try:
        size = os.lstat(paths.journal).st_size
    except FileNotFoundError:
        return msgspec.structs.replace(head, journal_bytes=0, journal_mac="")
    _, tail = _journal_tail(paths, size)
    return msgspec.structs.replace(head, journal_bytes=size, journal_mac=tail.hex())


def _journal_tail(paths: RunPaths, end: int) -> tuple[int, bytes]:
    """The size of ``effects.log`` and the (up to) 32 bytes before offset ``end``."""
    try:
        fd = fsio.open_regular(paths.journal)
    except FileNotFoundError:
        return 0, b""
    except OSError:
        return 0, b""
    try:
        size = os.fstat(fd).st_size
        if size < end:
            return size, b""
        start = max(end - MAC_SIZE, 0)
        return size, os.pread(fd, end - start, start)
    finally:
        os.close(fd)


class HeadKeeper:
    """Moves one run's head forward as its writer acknowledges writes. Thread-safe.

    It rewrites the head record in place (one ``pwrite`` of a fixed-size record on a
    descriptor kept open, no rename): the cost of a keyed checkpoint or journaled call
    stays a few microseconds. A head cut short by a crash does not verify and is then
    treated as absent (its run's next writer anchors a new one); a head that cannot be
    written is logged and skipped: the write it describes is already durable, and a head
    that lags is never reported as a rollback.
    """

    def __init__(self, heads: HeadStore, head: Head) -> None:
        self._heads = heads
        self._head = head
        self._lock = threading.Lock()
        self._warned = False
        self._fd: int | None = None
        try:
            self._fd = heads.open_for_updates(head.run_id)
        except OSError as exc:
            self._warn(exc)

    @property
    def head(self) -> Head:
        """The head as last written."""
        return self._head

    def checkpoint(self, seq: int, mac: bytes | None) -> None:
        """Checkpoint ``seq`` (with MAC ``mac``) is durable."""
        self._move(seq=seq, mac=(mac or b"").hex())

    def journal(self, end: int, tail: bytes) -> None:
        """``effects.log`` is durable up to ``end``; ``tail`` is its last record's MAC."""
        self._move(journal_bytes=end, journal_mac=tail.hex())

    def meta(self, updated_ms: int) -> None:
        """A ``run.meta`` with this ``updated_ms`` is durable."""
        self._move(meta_updated_ms=updated_ms)

    def loosen(self) -> None:
        """Before its writer deletes checkpoints on purpose (a LangGraph thread pruned):
        narrow the record durably to the ``run.meta`` mark (:meth:`HeadStore.loosen`, as gc
        does), so that a crash before :meth:`reanchor` leaves it behind the run, never
        ahead; later updates go in place to the new record."""
        with self._lock:
            run_id, meta_updated_ms = self._head.run_id, self._head.meta_updated_ms
            self._heads.loosen(run_id, meta_updated_ms)
            self._head = Head(run_id=run_id, meta_updated_ms=meta_updated_ms)
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            try:
                self._fd = self._heads.open_for_updates(run_id)
            except OSError as exc:
                self._warn(exc)

    def reanchor(self, paths: RunPaths) -> None:
        """Take the head from disk: after the run's owner deleted its newest files on purpose."""
        with self._lock:
            head = with_disk_journal(with_disk_checkpoint(self._head, paths), paths)
            self._publish(head)

    def close(self) -> None:
        """Let go of the head record's descriptor (the writer closes)."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def _move(self, **fields: object) -> None:
        with self._lock:
            self._publish(msgspec.structs.replace(self._head, **fields))

    def _publish(self, head: Head) -> None:
        self._head = head
        if self._fd is None:
            return
        try:
            fsio.overwrite_unsynced(
                self._fd, self._heads.document(head), self._heads.path(head.run_id)
            )
        except OSError as exc:
            self._warn(exc)

    def _warn(self, exc: OSError) -> None:
        if not self._warned:
            self._warned = True
            log.warning(
                "run %s: head record not updated (%s): rollback protection lags until "
                "the run is next opened for writing",
                self._head.run_id,
                exc,
            )


__all__ = [
    "HEAD_DIR_ENV",
    "Head",
    "HeadKeeper",
    "HeadStore",
    "store_dir",
    "store_id",
    "with_disk_checkpoint",
    "with_disk_journal",
]
