"""Writing one run directory: the owner lock and durable checkpoints.

A :class:`RunWriter` holds ``owner.lock`` for its whole life (one writer per
run, docs/guarantees.md, 7). A ``sync`` checkpoint costs two fsyncs, the floor for a
durable publish: the temp file, then the run directory once after the rename
and the ``latest`` swap (docs/guarantees.md, 1).

The writer orchestrates; each concern has its own module. Its checkpoints, from the
run's resume point to each publish and the lock's lifetime, are
:class:`~.checkpointing.CheckpointWriter`'s, the base it is built on; this module adds
the run's status changes (a pause, a terminal checkpoint carrying its meta), the
effect journal, opened once on first use (:mod:`.writer_journal`), and readers.
:func:`open_writer` takes the lock and writes the meta of the new attempt.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from afk_local.errors import KeyRequiredError
from afk_local.storage.format import codec
from afk_local.storage.format.codec import RecordCodec
from afk_local.storage.format.layout import RunPaths
from afk_local.storage.format.records import (
    META_COPY_KEY,
    Checkpoint,
    ErrorInfo,
    PauseInfo,
    Phase,
    RunMeta,
    RunStatus,
    error_info,
)
from afk_local.storage.rundir.effects import EffectLog
from afk_local.storage.rundir.mirror import Mirror, RunMirror
from afk_local.storage.rundir.options import StoreOptions
from afk_local.storage.rundir.ownership import acquire_lock, current_owner
from afk_local.storage.rundir.read.chain import is_signed_file
from afk_local.storage.rundir.read.heads import HeadKeeper, HeadStore
from afk_local.storage.rundir.read.reader import RunReader
from afk_local.storage.rundir.run_changes import tell_meta
from afk_local.storage.rundir.write.checkpointing import CheckpointWriter
from afk_local.storage.rundir.write.creation import begin_run_dir
from afk_local.storage.rundir.write.meta_keeper import attempt_meta

# filelock is loaded where a lock is taken (ownership.acquire_lock), not on import.
if TYPE_CHECKING:
    from filelock import FileLock

__all__ = ["CheckpointWriter", "RunWriter", "open_writer"]


class RunWriter(CheckpointWriter):
    """The single writer of a run. Use as a context manager, or call :meth:`close`.

    Created by :meth:`afk_local.Store.create` and :meth:`afk_local.Store.resume_writer`.
    Threads sharing one writer are serialised: each checkpoint gets the next seq and
    none is lost (the effect journal does its own group commit). It orchestrates the
    collaborators this module's docstring names.
    """

    @property
    def effects(self) -> EffectLog:
        """The run's effect journal (``effects.log``), opened for writing on first use.

        An :class:`afk_local.Journal` (typed as such by ``afk_local.journal.journal_of``;
        storage opens it through :mod:`afk_local.storage.rundir.effects` and may not name
        it). Opening repairs a torn tail left by a crash; the journal closes with the
        writer. Threads that first use it at the same time share one journal. A new run
        that is not published yet is published first (the journal's records must be
        findable).
        """
        if self._new_run is not None:
            with self._serial:
                self._publish_new_run()
        return self._journal.get()

    def journal_records(self) -> int:
        """How many effect records are durable in the run's journal now: its position.

        Every checkpoint records it (``Checkpoint.journal_records``), so a fork at that
        checkpoint inherits exactly the effects journaled before it. A run without a
        journal is at 0; an existing one is opened (and a torn tail repaired) to count.
        """
        return self._journal.records()

    def reader(self) -> RunReader:
        """A reader of this run (sharing the codec)."""
        return RunReader(
            self.paths,
            record_codec=self._codec,
            max_record_bytes=self._max_record_bytes,
            env=self._env,
        )

    def __repr__(self) -> str:
        return (
            f"RunWriter(run_id={self.run_id!r}, seq={self._seq}, status={self._metas.meta.status})"
        )

    # -- status changes -----------------------------------------------------------

    def finish(self, result: Any = None, *, step: int | None = None, **extra: Any) -> Checkpoint:
        """Write the ``run_terminal`` checkpoint of a completed run and mark it completed."""
        payload = {"state": RunStatus.COMPLETED.value, "terminal_result": result, **extra}
        return self._terminal(payload, step, status=RunStatus.COMPLETED, pause=None, error=None)

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
        return self._terminal(payload, step, status=RunStatus.FAILED, error=info)

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

    def _terminal(self, payload: dict[str, Any], step: int | None, **changes: Any) -> Checkpoint:
        """Write the ``run_terminal`` checkpoint, then the status it carries into ``run.meta``.

        The checkpoint carries a copy of the new meta's bytes
        (:data:`~afk_local.storage.format.records.META_COPY_KEY`), so the meta's rename is
        left to the next fsync of the run directory, or to none: readers take the copy
        when its ``updated_ms`` is newer than the meta on disk (:func:`.reader.read_meta`),
        one clock (the meta's own stamps), never the checkpoint's stamp against the
        meta's. In a store without a head record or a mirror the meta's bytes are not
        fsynced either (docs/guarantees.md, "What a new run costs").
        """
        with self._life, self._serial:  # one write: the lock outlives the meta's too
            meta, data = self._metas.next(**changes)
            payload = {**payload, META_COPY_KEY: data}
            record = self._write(Phase.RUN_TERMINAL.value, payload, self._step(step))
            self._metas.put_carried(meta, data)
            return record

    # -- health -------------------------------------------------------------------

    def flush_mirror(self, timeout: float) -> None:
        """Wait until the remote mirror has everything acknowledged so far (no-op without one).

        Raises:
            MirrorError: the mirror failed, or did not catch up within ``timeout`` seconds.
            LeaseLostError: another store took the run.
        """
        if self._mirror is not None:
            self._mirror.flush(timeout)

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
    defer_publish: bool = False,
) -> RunWriter:
    """Lock a run directory and return its writer; with ``new_meta``, create the run.

    The writer's settings and its I/O seam come from ``options`` (the store's);
    ``lock_timeout`` (default ``options.lock_timeout``) is how long to wait for the lock,
    and ``record_codec``, ``mirror`` and ``heads`` are what the store built from them.

    Opening an existing run starts a new attempt (``attempt`` + 1, this process as
    owner) unless ``new_attempt`` is False: cancelling or settling a run is not an
    attempt to run it, so only the owner is recorded. A new run made with
    ``new_attempt`` False is made for another process to start (attempt 0, no owner).

    With ``new_meta`` the run is built under a temporary name, its lock held there,
    and published with one rename (:mod:`.creation`): at once, or with
    ``defer_publish`` (a store without a mirror or a key) by the writer's first
    checkpoint, first use of its journal, or close, so that a new run's meta changes
    and first checkpoint cost one set of fsyncs (docs/guarantees.md, "What a new run
    costs"). Until then the run is not in the store.

    With a ``mirror``, the run's remote lease is checked (or taken, for a run the
    remote does not know) before anything is written. With ``heads`` (a keyed
    store) an existing run is first compared with its head record, and the head
    then follows every write.

    Raises:
        KeyRequiredError: the run is signed and ``record_codec`` has no key.
        RunExistsError: ``new_meta`` was given but the run exists (a deferred publish
            raises it from the write that publishes).
        LeaseLostError: the run is a copy pulled without ``--take``, or the mirror
            says another store holds its lease.
        RunRolledBackError: the run is behind its head record (acknowledged writes gone).
    """
    if new_meta is not None:
        return _create(
            paths,
            options,
            record_codec=record_codec,
            new_meta=new_meta,
            new_attempt=new_attempt,
            defer_publish=defer_publish and mirror is None and heads is None,
            mirror=mirror,
            heads=heads,
        )
    if record_codec.signer is None and is_signed_file(paths.meta):
        raise KeyRequiredError(paths.run_id, str(paths.meta))
    timeout = options.lock_timeout if lock_timeout is None else lock_timeout
    lock = acquire_lock(paths, timeout)
    run_mirror: RunMirror | None = None
    try:
        meta = attempt_meta(
            paths,
            record_codec,
            owner=current_owner(),
            new_attempt=new_attempt,
            heads=heads,
        )
        if mirror is not None:
            run_mirror = mirror.attach(paths, record_codec)
        options.env.atomic_write(paths.meta, codec.encode_meta(record_codec, meta))
        tell_meta(paths, meta, record_codec.signer, options.env)
        writer = _writer_on(
            paths, lock, meta, options, record_codec=record_codec, mirror=run_mirror, heads=heads
        )
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


def _create(
    paths: RunPaths,
    options: StoreOptions,
    *,
    record_codec: RecordCodec,
    new_meta: RunMeta,
    new_attempt: bool,
    defer_publish: bool,
    mirror: Mirror | None,
    heads: HeadStore | None,
) -> RunWriter:
    """Build a new run under a temporary name, its lock held; publish it now unless
    ``defer_publish``."""
    new_run = begin_run_dir(paths, paths.dir.parent, options.env)
    lock = new_run.lock
    run_mirror: RunMirror | None = None
    try:
        meta = attempt_meta(
            paths, record_codec, owner=current_owner(), new_meta=new_meta, new_attempt=new_attempt
        )
        if defer_publish:
            return RunWriter(paths, lock, meta, options, record_codec=record_codec, new_run=new_run)
        new_run.publish(codec.encode_meta(record_codec, meta))
        tell_meta(paths, meta, record_codec.signer, options.env)
        if mirror is not None:
            run_mirror = mirror.attach(paths, record_codec)
        writer = _writer_on(
            paths, lock, meta, options, record_codec=record_codec, mirror=run_mirror, heads=heads
        )
    except BaseException:
        try:
            if run_mirror is not None:
                run_mirror.close()
            new_run.abandon()
        finally:
            lock.release()
        raise
    if run_mirror is not None:
        run_mirror.meta_replaced()
    return writer


def _writer_on(
    paths: RunPaths,
    lock: FileLock,
    meta: RunMeta,
    options: StoreOptions,
    *,
    record_codec: RecordCodec,
    mirror: RunMirror | None,
    heads: HeadStore | None,
) -> RunWriter:
    """The writer of the attempt whose ``meta`` is durable: its head record anchored
    there (a keyed store), the mirror attached."""
    keeper = None
    if heads is not None:
        keeper = HeadKeeper(heads, heads.anchor(paths, meta.updated_ms))
    writer = RunWriter(
        paths, lock, meta, options, record_codec=record_codec, mirror=mirror, head=keeper
    )
    if keeper is not None:
        writer.on_close(keeper.close)  # runs before the mirror's: after the journal's records
    return writer
