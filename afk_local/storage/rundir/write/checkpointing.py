"""Writing a run's checkpoint files: the collaborators of a writer, the next seq, and
the publish of each checkpoint.

:class:`CheckpointWriter` is the part of :class:`~.writer.RunWriter` that owns the
run's checkpoints while its owner lock is held: where the run on disk ends (its
newest seq, its loose files, the MAC the next checkpoint chains on) and a ``latest``
repaired to it; each checkpoint framed as a delta or a keyframe (:mod:`.delta_policy`),
signed (keyed stores), made durable and visible (:mod:`.publisher`), and only then
told to the head record (:mod:`.heads`), the remote mirror (:mod:`.mirror`) and the
packing trigger (:mod:`.pack_trigger`), in that order; a new run not published yet
published by its first durable write; and the writer's lifetime (:mod:`.lifetime`:
may it write, the lock kept until its last write ends). ``run.meta`` changes go
through :mod:`.meta_keeper`.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from afk_local.errors import AfkLocalError, UnstorableValueError
from afk_local.storage import fsio
from afk_local.storage.format import codec
from afk_local.storage.format.codec import RecordCodec
from afk_local.storage.format.integrity import NO_MAC, record_digest
from afk_local.storage.format.layout import (
    RunPaths,
    checkpoint_name,
    parse_checkpoint_name,
    scan_checkpoints,
    scan_run_files,
    validate_phase,
)
from afk_local.storage.format.records import (
    SCHEMA_VERSION,
    Checkpoint,
    Phase,
    RunMeta,
    RunStatus,
    now_ms,
)
from afk_local.storage.rundir.delta_policy import DeltaPolicy
from afk_local.storage.rundir.mirror import RunMirror
from afk_local.storage.rundir.options import StoreOptions
from afk_local.storage.rundir.packing import PackReport
from afk_local.storage.rundir.read.catalog import RunCatalog
from afk_local.storage.rundir.read.chain import read_link_value
from afk_local.storage.rundir.read.heads import HeadKeeper
from afk_local.storage.rundir.read.reader import RunReader
from afk_local.storage.rundir.run_changes import tell_meta
from afk_local.storage.rundir.write.creation import NewRunDir
from afk_local.storage.rundir.write.lifetime import WriterLifetime
from afk_local.storage.rundir.write.meta_keeper import MetaKeeper
from afk_local.storage.rundir.write.pack_trigger import PackTrigger
from afk_local.storage.rundir.write.publisher import Publisher
from afk_local.storage.rundir.write.writer_journal import WriterJournal

# filelock is loaded where a lock is taken (ownership.acquire_lock), not on import.
if TYPE_CHECKING:
    from filelock import FileLock

log = logging.getLogger("afk_local")


class CheckpointWriter:
    """A run's checkpoints while its lock is held: the base of
    :class:`~afk_local.storage.rundir.write.writer.RunWriter`, which adds the run's
    status changes, its journal and readers.

    Threads sharing one writer are serialised: each checkpoint gets the next seq and
    none is lost.
    """

    def __init__(
        self,
        paths: RunPaths,
        lock: FileLock,
        meta: RunMeta,
        options: StoreOptions,
        *,
        record_codec: RecordCodec,
        mirror: RunMirror | None = None,
        head: HeadKeeper | None = None,
        new_run: NewRunDir | None = None,
    ) -> None:
        self.paths = paths
        self.run_id = paths.run_id
        self._lock = lock
        self._codec = record_codec
        self._env = env = options.env  # every durable call of this writer goes through it
        self._max_record_bytes = options.max_record_bytes
        # Serialises the writes themselves: the next seq, the delta chains, the signature
        # chain and the meta are one state that two threads must never update at once.
        self._serial = threading.RLock()
        self._head = head  # keyed stores: the head record every acknowledged write moves
        # The remote mirror, if any: told after each acknowledged write, never before.
        self._mirror = mirror
        self._life = WriterLifetime(self.run_id, release=self._release, mirror=mirror)
        self._journal = self._life.journal = WriterJournal(
            paths.journal,
            self.run_id,
            record_codec=record_codec,
            listener=mirror,
            on_durable=None if head is None else head.journal,
            env=env,
            check_writable=self._life.check_writable,
            on_close=self._life.on_close,
        )
        if mirror is not None:  # its close hook goes first so it runs last (after the journal's)
            self.on_close(mirror.close)
        self._metas = MetaKeeper(
            paths,
            meta,
            record_codec=record_codec,
            head=head,
            mirror=mirror,
            env=env,
            on_failure=self._life.fail,
            on_disk=new_run is None,
        )
        # A new run not published yet (open_writer's ``defer_publish``): its meta changes
        # wait in memory, and its first durable write publishes the whole directory.
        self._new_run = new_run
        self._delta = DeltaPolicy(
            max_chain=options.max_chain, delta_fraction=options.delta_fraction, level=options.level
        )
        self._publisher = Publisher(paths, env, while_syncing=self._delta.prefetch.start)
        if new_run is None:
            self._publisher.remove_temp_files()
            self._seq, loose, self._prev_mac = _resume_point(paths, record_codec)
            _repair_latest(paths, record_codec, self._publisher)
        else:
            self._seq, loose, self._prev_mac = 0, 0, NO_MAC
        self._signer = record_codec.signer  # keyed: each MAC chains on the one before it
        self._packing = PackTrigger(
            paths,
            record_codec,
            limit=options.pack_loose_limit or 0,
            loose=loose,
            delta=self._delta,
            mirror=mirror,
            env=env,
            on_failure=self._life.fail,
        )

    # -- properties ---------------------------------------------------------------

    @property
    def meta(self) -> RunMeta:
        """The run's current ``run.meta``."""
        return self._metas.meta

    @property
    def seq(self) -> int:
        """The seq of the last checkpoint on disk (0 when none)."""
        return self._seq

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._life.closed

    @property
    def failed(self) -> BaseException | None:
        """The I/O error that made this writer refuse further writes, if any."""
        return self._life.failed

    @property
    def record_codec(self) -> RecordCodec:
        """The codec this writer encodes records with (the store's hooks)."""
        return self._codec

    @property
    def max_record_bytes(self) -> int:
        """The largest encoded record this writer stores."""
        return self._max_record_bytes

    # -- writing ------------------------------------------------------------------

    def checkpoint(
        self,
        phase: str | Phase,
        payload: Any,
        *,
        step: int,
        journal_records: int | None = None,
    ) -> Checkpoint:
        """Durably write the next checkpoint and point ``latest`` at it.

        Returns only after the file and the directory entry are on stable
        storage. Statuses follow writes: a run that was not ``running`` becomes so.
        ``journal_records`` is the journal position the state was taken at (default:
        now); a writer that persists later than it snapshots passes the earlier one.
        """
        phase_name = validate_phase(phase)
        with self._serial:
            if self._metas.meta.status is not RunStatus.RUNNING and phase_name not in (
                Phase.PAUSED.value,
                Phase.RUN_TERMINAL.value,
            ):
                self.update_meta(status=RunStatus.RUNNING, pause=None, error=None)
            return self._write(phase_name, payload, step, journal_records)

    def _write(
        self, phase: str, payload: Any, step: int, journal_records: int | None = None
    ) -> Checkpoint:
        """Frame, sign and publish the next checkpoint, then tell who follows the run."""
        with self._life, self._serial:  # checks the writer may write, before the journal opens
            if journal_records is None:
                journal_records = self._journal.records()
            record = Checkpoint(
                schema_version=SCHEMA_VERSION,
                run_id=self.run_id,
                thread_id=self._metas.meta.thread_id,
                seq=self._seq + 1,
                step=step,
                phase=phase,
                timestamp_ms=now_ms(),
                payload=payload,
                journal_records=journal_records,
            )
            try:
                raw = self._codec.encode(record)  # user data errors surface here, before any I/O
            except UnstorableValueError as exc:
                raise exc.under("", self.run_id) from None
            if len(raw) > self._max_record_bytes:
                raise ValueError(
                    f"checkpoint of {len(raw)} bytes exceeds "
                    f"max_record_bytes={self._max_record_bytes}"
                )
            mac = None
            if self._signer is not None:
                mac = self._signer.checkpoint_mac(
                    self.run_id, record.seq, phase, self._prev_mac, record_digest(raw)
                )
            data = self._delta.frame(record.seq, phase, raw, mac)
            name = checkpoint_name(record.seq, phase)
            if self._new_run is not None:
                self._publish_new_run((name, data))
            else:
                try:
                    self._publisher.publish(name, data)
                except BaseException as exc:
                    self._life.failed = exc
                    self._publisher.unpublish(name, self._seq)
                    raise
                self._delta.prefetch.synced()  # how long the disk's wait was: worth overlapping?
            self._seq = record.seq
            if mac is not None:
                self._prev_mac = mac
            if self._head is not None:
                self._head.checkpoint(record.seq, mac)
            if self._mirror is not None:
                self._mirror.published(name)  # acknowledged: only now may it leave the machine
            self._packing.published(record.seq, self._delta.keyframe_written, name, data)
            return record

    def _publish_new_run(self, checkpoint: tuple[str, bytes] | None = None) -> None:
        """Publish the new run's directory with its meta as it is now, ``checkpoint``
        and an empty ``effects.log`` in it (docs/guarantees.md, "What a new run costs").

        A failure is fatal for the writer, like any failed publish: a ``RunExistsError``
        says another creator published the same run id first.
        """
        new_run = self._new_run
        if new_run is None:
            return
        try:
            new_run.publish(
                codec.encode_meta(self._codec, self._metas.meta),
                checkpoint=checkpoint,
                journal=True,
            )
        except BaseException as exc:
            self._life.failed = exc
            raise
        self._new_run = None
        self._metas.on_disk = True
        tell_meta(self.paths, self._metas.meta, self._codec.signer, self._env)

    def publish(self) -> None:
        """Publish a new run made with ``publish_with_first_write`` now, with its meta as it
        is (no-op once published): the run is in the store from here on, before any
        checkpoint. A durable function does this before its body runs, so that a run
        whose process dies is there to resume, without a first checkpoint's fsync.

        Raises:
            RunExistsError: another creator published the same run id first.
        """
        self._life.check_writable()
        with self._serial:
            self._publish_new_run()

    def pack(self, *, full: bool = True) -> PackReport:
        """Fold every loose checkpoint file but the newest into packs, now.

        With ``full``, merge the run's packs too (into as few as the size bounds allow).
        """
        self._life.check_writable()
        return self._packing.pack(full=full)

    def update_meta(self, **changes: Any) -> RunMeta:
        """Replace ``run.meta`` atomically with ``changes`` applied (and ``updated_ms`` bumped)."""
        with self._life, self._serial:
            return self._metas.replace(**changes)

    def loosen_head(self) -> None:
        """Narrow the run's head record durably before this writer deletes checkpoints on
        purpose (:meth:`anchor_head` afterwards): a crash in between must not leave the
        head naming a checkpoint that is gone (a keyed store would call that a rollback)."""
        with self._serial:
            self._packing.forget_frames()  # the files it keeps may be rewritten or deleted
            if self._head is not None:
                self._head.loosen()

    def anchor_head(self) -> None:
        """Take the run's head record from disk, after this writer deleted its newest
        checkpoints on purpose (a keyed store would otherwise call that a rollback)."""
        with self._serial:
            if self._head is not None:
                self._head.reanchor(self.paths)

    # -- lifetime -----------------------------------------------------------------

    def on_close(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` when the writer closes, before the lock is released."""
        self._life.on_close(hook)

    def close(self) -> None:
        """Release the run's lock. Idempotent.

        A write that another thread is in the middle of keeps the lock until it ends
        (the release happens there): the lock outlives every write of this writer.
        In a forked child it only lets go of the inherited journal descriptor: the
        lock stays the parent's. A new run that no write published yet is published
        now, with its meta only, as :meth:`afk_local.Store.create` would have.
        """
        if self._new_run is not None and os.getpid() == self._life.pid and not self.closed:
            with self._serial:
                try:
                    if self._life.failed is None:
                        self._publish_new_run()
                except Exception as exc:
                    log.error("run %s: could not be published: %s", self.run_id, exc)
        self._life.close(inherited=self._journal.close_inherited)

    def _release(self) -> None:
        """After the last write: let go of the run directory's descriptor, then the lock
        (an unpublished new run's directory is removed first)."""
        self._publisher.close()
        if self._new_run is not None:
            self._new_run.abandon()
            self._new_run = None
        self._lock.release()


def _resume_point(paths: RunPaths, record_codec: RecordCodec) -> tuple[int, int, bytes]:
    """Where the run on disk ends: its newest seq, its loose files, and (keyed) the MAC
    the next checkpoint's chains on."""
    loose, packs = scan_run_files(paths.dir)
    newest = loose[-1] if loose else None
    catalog = RunCatalog(paths, signer=record_codec.signer)
    if packs and max(p.last for p in packs) > (newest.seq if newest else 0):
        every = catalog.files()  # the newest checkpoint is packed (rare): ask the packs
        newest = every[-1] if every else newest
    prev_mac = NO_MAC
    if record_codec.signer is not None and newest is not None:
        if newest.pack is None:
            prev_mac = read_link_value(str(paths.dir) + os.sep + newest.name) or NO_MAC
        else:
            prev_mac = catalog.link_value(newest)
    return (newest.seq if newest else 0), len(loose), prev_mac


def _repair_latest(paths: RunPaths, record_codec: RecordCodec, publisher: Publisher) -> None:
    """Point ``latest`` at the run's newest checkpoint file when it lags behind it.

    A kill between a checkpoint's rename and the swap of ``latest`` leaves ``latest`` one
    behind; a second such kill in the next attempt would leave it two behind, which is
    what a second writer rolling the run back looks like. So each attempt starts with
    ``latest`` at the newest checkpoint that decodes (made durable before anything is
    written), and ``latest`` never lags by more than the one checkpoint in flight.
    """
    files = scan_checkpoints(paths.dir)
    if not files:
        return
    target = fsio.read_link(paths.latest)
    parsed = parse_checkpoint_name(target) if target is not None else None
    if parsed is None or parsed.seq >= files[-1].seq:
        return  # none (readers scan), or at the newest
    try:
        RunReader(paths, record_codec=record_codec).load(files[-1])
    except AfkLocalError:
        return  # the newest file is damaged: readers skip it, latest stays
    publisher.repoint_latest(files[-1].name)
