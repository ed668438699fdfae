"""Writing one run directory: the owner lock and durable checkpoints.

A :class:`RunWriter` holds ``owner.lock`` for its whole life (one writer per
run, docs/guarantees.md, 7). A ``sync`` checkpoint costs two fsyncs, the floor for a
durable publish: the temp file, then the run directory once after the rename
and the ``latest`` swap (docs/guarantees.md, 1).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple

import msgspec
from filelock import FileLock

from afk_local.errors import (
    ForkedWriterError,
    KeyRequiredError,
    LeaseLostError,
    RunExistsError,
    UnstorableValueError,
    WriterFailedError,
)
from afk_local.storage import fsio
from afk_local.storage.format import codec
from afk_local.storage.format.codec import RecordCodec
from afk_local.storage.format.integrity import NO_MAC, record_digest
from afk_local.storage.format.layout import (
    LATEST_NAME,
    RunPaths,
    checkpoint_name,
    scan_checkpoints,
    scan_run_files,
    validate_phase,
)
from afk_local.storage.format.records import (
    SCHEMA_VERSION,
    Checkpoint,
    ErrorInfo,
    PauseInfo,
    Phase,
    RunMeta,
    RunStatus,
    error_info,
    later_ms,
    now_ms,
)
from afk_local.storage.rundir.catalog import RunCatalog
from afk_local.storage.rundir.chain import is_signed_file, read_link_value
from afk_local.storage.rundir.delta_prefetch import DeltaPrefetch
from afk_local.storage.rundir.effects import EffectLog, open_effect_log
from afk_local.storage.rundir.heads import HeadKeeper, HeadStore
from afk_local.storage.rundir.mirror import REMOTE_COPY_KEY, Mirror, RunMirror
from afk_local.storage.rundir.options import StoreOptions
from afk_local.storage.rundir.ownership import acquire_lock, current_owner
from afk_local.storage.rundir.packing import PackReport, pack_run
from afk_local.storage.rundir.reader import RunReader, read_meta

log = logging.getLogger("afk_local")

_MAX_CHAINS = 16
"""Phases whose newest record a writer keeps as a delta base (oldest used is dropped)."""


class _Chain(NamedTuple):
    """The newest checkpoint of one phase: the base of that phase's next delta."""

    raw: bytes
    seq: int
    length: int
    keyframe: int
    """The seq of the chain's keyframe."""


_MIRROR_CATCH_UP_S = 30.0
"""How long a mirrored writer waits, once per pack, for the remote to hold what it packs."""


class _WriteScope:
    """One write of a writer, as a ``with`` block: refused once the writer is closed, and
    a close meanwhile waits for its end to release the lock. One reusable object per
    writer (its state is the writer's): cheaper than a generator-based context manager,
    which every sync checkpoint would build and tear down."""

    __slots__ = ("_writer",)

    def __init__(self, writer: RunWriter) -> None:
        self._writer = writer

    def __enter__(self) -> None:
        self._writer._begin_write()

    def __exit__(self, *exc_info: object) -> None:
        self._writer._end_write()


class RunWriter:
    """The single writer of a run. Use as a context manager, or call :meth:`close`.

    Created by :meth:`afk_local.Store.create` and :meth:`afk_local.Store.resume_writer`.
    Threads sharing one writer are serialised: each checkpoint gets the next seq and
    none is lost (the effect journal does its own group commit).
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
    ) -> None:
        self.paths = paths
        self.run_id = paths.run_id
        self._pid = os.getpid()  # a forked child inherits this object, never the right to write
        self._lock = lock
        self._meta = meta
        self._codec = record_codec
        self._env = options.env  # every durable call of this writer goes through it
        self._max_record_bytes = options.max_record_bytes
        self._max_chain = options.max_chain
        self._delta_fraction = options.delta_fraction
        self._level = level = options.level
        self._failed: BaseException | None = None
        self._closed = False
        # The lock outlives every write: close() while another thread is inside a write
        # (an async writer's thread stuck on a slow disk) leaves the release to that
        # write's end, or a new owner could take the run while this one still renames.
        self._lifetime = threading.Lock()
        self._writes_in_flight = 0
        self._write_scope = _WriteScope(self)
        self._release_pending = False
        # Serialises the writes themselves: the next seq, the delta chains, the signature
        # chain and the meta are one state that two threads must never update at once.
        self._serial = threading.RLock()
        self._head = head  # keyed stores: the head record every acknowledged write moves
        self._close_hooks: list[Callable[[], None]] = []
        self._journal: EffectLog | None = None
        self._journal_lock = threading.Lock()
        self._journal_absent = False  # no effects.log yet (only our own journal creates one)
        # The remote mirror, if any: told after each acknowledged write, never before.
        # Its close hook goes first so it runs last (after the journal's).
        self._mirror = mirror
        if mirror is not None:
            self.on_close(mirror.close)
        # Delta state per phase: the newest checkpoint of each phase written by this
        # writer is the base of the next one of that phase. Empty after open, so the
        # first checkpoint of every attempt is a keyframe.
        self._chains: OrderedDict[str, _Chain] = OrderedDict()
        # The checkpoint just written is its phase's next delta base: its compressor is
        # prepared in the background while this writer waits for the disk.
        self._prefetch = DeltaPrefetch(level)
        self._key_ratio = 0.3
        self._dir = str(paths.dir) + os.sep
        self._dir_fd: int | None = None  # the run directory, opened once for its fsyncs
        self._latest = str(paths.latest)
        self._remove_temp_files()
        loose, packs = scan_run_files(paths.dir)
        newest = loose[-1] if loose else None
        catalog = RunCatalog(paths, signer=record_codec.signer)
        if packs and max(p.last for p in packs) > (newest.seq if newest else 0):
            every = catalog.files()  # the newest checkpoint is packed (rare): ask the packs
            newest = every[-1] if every else newest
        self._seq = newest.seq if newest else 0
        # Packing: past pack_loose_limit loose files, the older ones go into a pack.
        self._pack_limit = options.pack_loose_limit or 0
        self._loose = len(loose)
        # Keyed store: each checkpoint's MAC chains on the MAC of the one before it.
        self._signer = record_codec.signer
        self._prev_mac = NO_MAC
        if self._signer is not None and newest is not None:
            if newest.pack is None:
                self._prev_mac = read_link_value(self._dir + newest.name) or NO_MAC
            else:
                self._prev_mac = catalog.link_value(newest)

    # -- properties ---------------------------------------------------------------

    @property
    def meta(self) -> RunMeta:
        """The run's current ``run.meta``."""
        return self._meta

    @property
    def seq(self) -> int:
        """The seq of the last checkpoint on disk (0 when none)."""
        return self._seq

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._closed

    @property
    def failed(self) -> BaseException | None:
        """The I/O error that made this writer refuse further writes, if any."""
        return self._failed

    @property
    def record_codec(self) -> RecordCodec:
        """The codec this writer encodes records with (the store's hooks)."""
        return self._codec

    @property
    def max_record_bytes(self) -> int:
        """The largest encoded record this writer stores."""
        return self._max_record_bytes

    @property
    def effects(self) -> EffectLog:
        """The run's effect journal (``effects.log``), opened for writing on first use.

        An :class:`afk_local.Journal` (typed as such by ``afk_local.journal.journal_of``;
        storage opens it through :mod:`afk_local.storage.rundir.effects` and may not name
        it). Opening repairs a torn tail left by a crash; the journal closes with the
        writer. Threads that first use it at the same time share one journal.
        """
        journal = self._journal
        if journal is None:
            # One journal per run: a second one would append with its own offsets and
            # signature chain, and skip the directory fsync that the first one (which
            # created effects.log) may not have made yet.
            with self._journal_lock:
                journal = self._journal
                if journal is None:
                    self._check_writable()
                    journal = open_effect_log(
                        self.paths.journal,
                        self.run_id,
                        record_codec=self._codec,
                        listener=self._mirror,
                        on_durable=None if self._head is None else self._head.journal,
                        env=self._env,
                    )
                    self.on_close(journal.close)
                    self._journal = journal
                    self._journal_absent = False
        return journal

    def journal_records(self) -> int:
        """How many effect records are durable in the run's journal now: its position.

        Every checkpoint records it (``Checkpoint.journal_records``), so a fork at that
        checkpoint inherits exactly the effects journaled before it. A run without a
        journal is at 0; an existing one is opened (and a torn tail repaired) to count.
        """
        if self._journal is None:
            if self._journal_absent or not os.path.lexists(self.paths.journal):
                self._journal_absent = True
                return 0
            return len(self.effects)
        return len(self._journal)

    def reader(self) -> RunReader:
        """A reader of this run (sharing the codec)."""
        return RunReader(
            self.paths,
            record_codec=self._codec,
            max_record_bytes=self._max_record_bytes,
            env=self._env,
        )

    def __repr__(self) -> str:
        return f"RunWriter(run_id={self.run_id!r}, seq={self._seq}, status={self._meta.status})"

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
            if self._meta.status is not RunStatus.RUNNING and phase_name not in (
                Phase.PAUSED.value,
                Phase.RUN_TERMINAL.value,
            ):
                self.update_meta(status=RunStatus.RUNNING, pause=None, error=None)
            return self._write(phase_name, payload, step, journal_records)

    def _write(
        self, phase: str, payload: Any, step: int, journal_records: int | None = None
    ) -> Checkpoint:
        if journal_records is None:
            self._check_writable()
            journal_records = self.journal_records()
        with self._write_scope, self._serial:
            return self._write_checkpoint(phase, payload, step, journal_records)

    def _write_checkpoint(
        self, phase: str, payload: Any, step: int, journal_records: int
    ) -> Checkpoint:
        record = Checkpoint(
            schema_version=SCHEMA_VERSION,
            run_id=self.run_id,
            thread_id=self._meta.thread_id,
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
                f"checkpoint of {len(raw)} bytes exceeds max_record_bytes={self._max_record_bytes}"
            )
        mac = None
        if self._signer is not None:
            mac = self._signer.checkpoint_mac(
                self.run_id, record.seq, phase, self._prev_mac, record_digest(raw)
            )
        data = self._frame(record.seq, phase, raw, mac)
        name = checkpoint_name(record.seq, phase)
        try:
            if self._dir_fd is None:
                self._dir_fd = fsio.open_dir(self._dir)
            self._env.publish_with_link(
                self._dir,
                name,
                data,
                LATEST_NAME,
                dir_fd=self._dir_fd,
                while_syncing=self._prefetch.start,
            )
        except BaseException as exc:
            self._failed = exc
            self._unpublish(name)
            raise
        self._seq = record.seq
        if mac is not None:
            self._prev_mac = mac
        if self._head is not None:
            self._head.checkpoint(record.seq, mac)
        if self._mirror is not None:
            self._mirror.published(name)  # acknowledged: only now may it leave the machine
        self._loose += 1
        if self._pack_limit and self._loose >= self._pack_limit:
            keyframe = self._chains[phase].keyframe == record.seq
            if keyframe or self._loose >= 2 * self._pack_limit:
                self._pack_older()
        return record

    def _pack_older(self) -> None:
        """Fold the older loose files into a pack, at a keyframe.

        The delta chains still being extended stay loose (back to their keyframes), but
        never more than half the limit: so the newest checkpoints decode from loose
        files. Called after a checkpoint was acknowledged: a failure cannot take it
        back, so it is logged and makes the writer refuse further writes.
        """
        half = max(1, self._pack_limit // 2)
        recent = self._seq - half
        active = [c.keyframe for c in self._chains.values() if c.seq > recent]
        keep_from = max(min(active, default=self._seq), recent + 1)
        if self._mirror is not None:
            # A mirror uploads published files by name, in the background: the files
            # about to be packed away must be on the remote first. If it cannot catch
            # up now, the files stay loose until the next keyframe (its own error
            # surfaces through check() and flush, never through this checkpoint).
            try:
                self._mirror.flush(_MIRROR_CATCH_UP_S)
            except Exception as exc:
                log.info("run %s: not packing yet, the mirror is behind: %s", self.run_id, exc)
                return
        try:
            report = pack_run(
                self.paths, self._codec, keep_from=keep_from, sync_removals=False, env=self._env
            )
        except Exception as exc:
            log.error("run %s: packing older checkpoints failed: %s", self.run_id, exc)
            self._failed = exc
            return
        self._loose = report.loose_left

    def pack(self, *, full: bool = True) -> PackReport:
        """Fold every loose checkpoint file but the newest into packs, now.

        With ``full``, merge the run's packs too (into as few as the size bounds allow).
        """
        self._check_writable()
        if self._mirror is not None:  # what is packed away must be on the remote first
            self._mirror.flush(_MIRROR_CATCH_UP_S)
        try:
            report = pack_run(self.paths, self._codec, full=full, env=self._env)
        except BaseException as exc:
            self._failed = exc
            raise
        self._loose = report.loose_left
        return report

    def _unpublish(self, name: str) -> None:
        # The failed checkpoint was never acknowledged: take it back out of sight
        # so the visible run is the last acknowledged state. Best effort only —
        # the writer is dead either way and readers tolerate what is left.
        previous = fsio.read_link(self._latest)
        with contextlib.suppress(OSError):
            self._env.unlink(self._dir + name)
        if previous == name:
            if self._seq:
                good = next(
                    (f.name for f in scan_checkpoints(self.paths.dir) if f.seq == self._seq), None
                )
                if good is not None:
                    with contextlib.suppress(OSError):
                        self._env.atomic_symlink(good, self.paths.latest, sync_dir=False)
            else:
                with contextlib.suppress(OSError):
                    self._env.unlink(self.paths.latest)

    def _frame(self, seq: int, phase: str, raw: bytes, mac: bytes | None) -> bytes:
        # The base is the newest earlier checkpoint of the same phase, not simply the
        # previous checkpoint: in the agent protocol a large runtime_state follows a
        # tiny phase payload, and a delta against that is as big as a keyframe.
        chain = self._chains.pop(phase, None)
        if (
            chain is not None
            and chain.length < self._max_chain
            and len(chain.raw) <= codec.MAX_DELTA_BASE_BYTES
        ):
            body = self._prefetch.compress(phase, chain.raw, raw)
            if len(body) <= self._delta_fraction * self._key_ratio * len(raw) + 64:
                self._remember_chain(phase, _Chain(raw, seq, chain.length + 1, chain.keyframe))
                return codec.pack_frame(
                    codec.KIND_CHECKPOINT,
                    body,
                    flags=codec.FLAG_DELTA,
                    base_seq=chain.seq,
                    mac=mac,
                )
        body = codec.compress(raw, level=self._level)
        self._key_ratio = len(body) / max(len(raw), 1)
        self._remember_chain(phase, _Chain(raw, seq, 0, seq))
        return codec.pack_frame(codec.KIND_CHECKPOINT, body, mac=mac)

    def _remember_chain(self, phase: str, chain: _Chain) -> None:
        self._chains[phase] = chain
        if chain.length < self._max_chain and len(chain.raw) <= codec.MAX_DELTA_BASE_BYTES:
            self._prefetch.submit(phase, chain.raw)
        else:
            self._prefetch.forget(phase)
        while len(self._chains) > _MAX_CHAINS:
            self._prefetch.forget(self._chains.popitem(last=False)[0])

    def update_meta(self, **changes: Any) -> RunMeta:
        """Replace ``run.meta`` atomically with ``changes`` applied (and ``updated_ms`` bumped)."""
        with self._write_scope, self._serial:
            meta = msgspec.structs.replace(
                self._meta, updated_ms=later_ms(self._meta.updated_ms), **changes
            )
            data = codec.encode_meta(self._codec, meta)  # a bad value fails here, before I/O
            try:
                self._env.atomic_write(self.paths.meta, data)
            except BaseException as exc:
                self._failed = exc
                raise
            self._meta = meta
            if self._head is not None:
                self._head.meta(meta.updated_ms)
            if self._mirror is not None:
                self._mirror.meta_replaced()
            return meta

    def anchor_head(self) -> None:
        """Take the run's head record from disk, after this writer deleted its newest
        checkpoints on purpose (a keyed store would otherwise call that a rollback)."""
        with self._serial:
            if self._head is not None:
                self._head.reanchor(self.paths)

    def finish(self, result: Any = None, *, step: int | None = None, **extra: Any) -> Checkpoint:
        """Write the ``run_terminal`` checkpoint of a completed run and mark it completed."""
        payload = {"state": RunStatus.COMPLETED.value, "terminal_result": result, **extra}
        with self._serial:
            record = self._write(Phase.RUN_TERMINAL.value, payload, self._step(step))
            self.update_meta(status=RunStatus.COMPLETED, pause=None, error=None)
            return record

    def fail(
        self, error: BaseException | ErrorInfo | str, *, step: int | None = None, **extra: Any
    ) -> Checkpoint:
        """Write a ``run_terminal`` checkpoint with state ``failed`` and mark the run failed."""
        info = error_info(error)
        payload = {
            "state": RunStatus.FAILED.value,
            "message": info.message,
            "error": msgspec.to_builtins(info),
            **extra,
        }
        with self._serial:
            record = self._write(Phase.RUN_TERMINAL.value, payload, self._step(step))
            self.update_meta(status=RunStatus.FAILED, error=info)
            return record

    def cancel(self, reason: str = "cancelled", *, step: int | None = None) -> Checkpoint:
        """Make the run terminal with state ``cancelled``."""
        payload = {"state": RunStatus.CANCELLED.value, "message": reason}
        with self._serial:
            record = self._write(Phase.RUN_TERMINAL.value, payload, self._step(step))
            self.update_meta(status=RunStatus.CANCELLED, pause=None)
            return record

    def pause(
        self, kind: str = "input", prompt: Any = None, *, step: int | None = None, **extra: Any
    ) -> Checkpoint:
        """Write a ``paused`` checkpoint and mark the run paused, waiting for input."""
        payload = {"kind": kind, "prompt": prompt, **extra}
        with self._serial:
            record = self._write(Phase.PAUSED.value, payload, self._step(step))
            self.update_meta(
                status=RunStatus.PAUSED, pause=PauseInfo(kind=kind, prompt=prompt, seq=record.seq)
            )
            return record

    def _step(self, step: int | None) -> int:
        if step is not None:
            return step
        latest = self.reader().latest() if self._seq else None
        return latest.step if latest is not None else 0

    def _begin_write(self) -> None:
        """Count one write in: refused once closed (see :class:`_WriteScope`)."""
        self._check_process()  # before any lock: one a parent's thread held at fork stays held
        with self._lifetime:
            self._check_writable()
            self._writes_in_flight += 1

    def _end_write(self) -> None:
        """Count one write out; a close that waited for it releases the lock now."""
        with self._lifetime:
            self._writes_in_flight -= 1
            release = self._release_pending and self._writes_in_flight == 0
            if release:
                self._release_pending = False
        if release:
            self._release()
            log.info("run %s: lock released after the last write of a closed writer", self.run_id)

    def _check_process(self) -> None:
        if os.getpid() != self._pid:
            raise ForkedWriterError(self.run_id, self._pid, os.getpid())

    def _check_writable(self) -> None:
        self._check_process()
        if self._closed:
            raise WriterFailedError(self.run_id, RuntimeError("writer is closed"))
        if self._failed is not None:
            raise WriterFailedError(self.run_id, self._failed)
        if self._journal is not None and self._journal.failed is not None:
            # The journal lost a record it could not make durable: the run on disk is
            # the truth now, and only a reopen reads it.
            raise WriterFailedError(self.run_id, self._journal.failed)
        if self._mirror is not None:
            self._mirror.check()  # LeaseLostError once another store took the run

    def flush_mirror(self, timeout: float) -> None:
        """Wait until the remote mirror has everything acknowledged so far (no-op without one).

        Raises:
            MirrorError: the mirror failed, or did not catch up within ``timeout`` seconds.
            LeaseLostError: another store took the run.
        """
        if self._mirror is not None:
            self._mirror.flush(timeout)

    def _remove_temp_files(self) -> None:
        # A crash can leave files, symlinks (a half-swapped latest) or whole
        # directories here; none of them may keep the run from reopening.
        with os.scandir(self.paths.dir) as entries:
            stray = [e.path for e in entries if e.name.startswith(fsio.TEMP_PREFIX)]
        for path in stray:
            self._env.remove_temp_entry(path)
        if stray:
            log.info("run %s: removed %d stray temp file(s)", self.run_id, len(stray))

    # -- lifetime -----------------------------------------------------------------

    def on_close(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` when the writer closes, before the lock is released."""
        self._close_hooks.append(hook)

    def close(self) -> None:
        """Release the run's lock. Idempotent.

        A write that another thread is in the middle of keeps the lock until it ends
        (the release happens there): the lock outlives every write of this writer.
        In a forked child it only lets go of the inherited journal descriptor: the
        lock stays the parent's.
        """
        if os.getpid() != self._pid:
            self._closed = True
            if self._journal is not None:
                self._journal.close()  # the journal knows it was inherited: no lock, no fsync
            return
        with self._lifetime:
            if self._closed:
                return
            self._closed = True  # from here on no write starts
        try:
            for hook in reversed(self._close_hooks):
                hook()
        finally:
            with self._lifetime:
                release = self._writes_in_flight == 0
                self._release_pending = not release
            if release:
                self._release()
            else:
                log.warning(
                    "run %s: closed while a write is in progress; the lock stays held until it "
                    "ends",
                    self.run_id,
                )

    def _release(self) -> None:
        """After the last write: let go of the run directory's descriptor, then the lock."""
        if self._dir_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._dir_fd)
            self._dir_fd = None
        self._lock.release()

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def open_writer(
    paths: RunPaths,
    options: StoreOptions,
    *,
    record_codec: RecordCodec,
    lock_timeout: float | None = None,
    new_meta: RunMeta | None = None,
    new_attempt: bool = True,
    mirror: Mirror | None = None,
    heads: HeadStore | None = None,
) -> RunWriter:
    """Lock a run directory and return its writer; with ``new_meta``, write it first.

    The writer's settings and its I/O seam come from ``options`` (the store's);
    ``lock_timeout`` (default ``options.lock_timeout``) is how long to wait for the lock,
    and ``record_codec``, ``mirror`` and ``heads`` are what the store built from them.

    Opening an existing run starts a new attempt (``attempt`` + 1, this process as
    owner) unless ``new_attempt`` is False: cancelling or settling a run is not an
    attempt to run it, so only the owner is recorded.

    With ``new_meta`` the run must still be new once the lock is held: a creator
    that found the directory without a meta may have lost the race to one that
    has since written it and let go of the lock.

    With a ``mirror``, the run's remote lease is checked (or taken, for a run the
    remote does not know) before anything is written. With ``heads`` (a keyed
    store) an existing run is first compared with its head record, and the head
    then follows every write.

    Raises:
        KeyRequiredError: the run is signed and ``record_codec`` has no key.
        RunExistsError: ``new_meta`` was given but the run has a ``run.meta`` by now.
        LeaseLostError: the run is a copy pulled without ``--take``, or the mirror
            says another store holds its lease.
        RunRolledBackError: the run is behind its head record (acknowledged writes gone).
    """
    if new_meta is None and record_codec.signer is None and is_signed_file(paths.meta):
        raise KeyRequiredError(paths.run_id, str(paths.meta))
    timeout = options.lock_timeout if lock_timeout is None else lock_timeout
    lock = acquire_lock(paths, timeout)
    run_mirror: RunMirror | None = None
    try:
        owner = current_owner()
        if new_meta is not None and os.path.lexists(paths.meta):
            raise RunExistsError(paths.run_id, str(paths.dir))
        if new_meta is not None:
            meta = msgspec.structs.replace(new_meta, owner=owner, attempt=1)
        else:
            old = read_meta(paths, record_codec)
            _refuse_remote_copy(old)
            if heads is not None:
                heads.require_not_behind(paths, old.updated_ms)
            attempt = old.attempt + 1 if new_attempt else old.attempt
            meta = msgspec.structs.replace(
                old, owner=owner, attempt=attempt, updated_ms=later_ms(old.updated_ms)
            )
        if mirror is not None:
            run_mirror = mirror.attach(paths, record_codec)
        options.env.atomic_write(paths.meta, codec.encode_meta(record_codec, meta))
        keeper = None
        if heads is not None:
            keeper = HeadKeeper(heads, heads.anchor(paths, meta.updated_ms))
        writer = RunWriter(
            paths, lock, meta, options, record_codec=record_codec, mirror=run_mirror, head=keeper
        )
        if keeper is not None:
            writer.on_close(keeper.close)  # runs before the mirror's: after the journal's records
    except BaseException:
        try:
            if run_mirror is not None:
                run_mirror.close()
        finally:
            lock.release()
        raise
    if run_mirror is not None:
        run_mirror.meta_replaced()
    return writer


def _refuse_remote_copy(meta: RunMeta) -> None:
    # A run pulled without --take is somebody else's: writing it here would fork its
    # history behind the lease holder's back (docs/remote.md).
    copy = meta.extra.get(REMOTE_COPY_KEY)
    if isinstance(copy, dict):
        raise LeaseLostError(
            meta.run_id,
            str(copy.get("url", "its remote")),
            f"this is a read-only copy pulled without --take (the lease is held by store "
            f"{copy.get('holder', '?')} at epoch {copy.get('epoch', '?')})",
        )
