"""``StateCheckpoint``: make a plain loop resumable with three calls.

A :class:`StateCheckpoint` is a store of its own with one run in it, so the
files, the guarantees and the tools (``afk-local runs --root PATH``) are the
same as for any run::

    PATH/runs/state/run.meta, 000000000001.runtime_state.ckpt, latest, ...

Example (a notebook cell you can re-run after a kernel restart):
    >>> import afk_local as afk
    >>> ckpt = afk.StateCheckpoint("/tmp/afk-doc-simple")
    >>> ckpt.clear()
    >>> state = ckpt.load() or {"i": 0, "total": 0}
    >>> for i in range(state["i"], 5):
    ...     state["total"] += i
    ...     state["i"] = i + 1
    ...     ckpt.save(state)
    >>> ckpt.mark_complete(state["total"])
    >>> ckpt.load() is None, ckpt.get_result()
    (True, 10)
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
from pathlib import Path
from typing import Any, Literal

from afk_local.errors import (
    CheckpointCorruptionError,
    IntOutOfRangeError,
    RunNotFoundError,
    UnstorableValueError,
)
from afk_local.runner.run.script_exit import install_script_excepthook
from afk_local.runner.writer import Durability, DurableWriter
from afk_local.storage.format.codec import DecHook, EncHook
from afk_local.storage.format.records import Phase, RunStatus
from afk_local.storage.store import Store

OnDamage = Literal["raise", "fresh"]
"""What :meth:`StateCheckpoint.load` does when every checkpoint is damaged."""

RUN_ID = "state"
"""The id of the one run inside a StateCheckpoint directory."""

_open_lock = threading.Lock()
_open_writers: dict[Path, DurableWriter] = {}
"""Writers held by this process, by directory: a re-created StateCheckpoint (a re-run
notebook cell) shares the writer instead of tripping over its own lock."""


class StateCheckpoint:
    """Durable save/load of one state object, kept in the directory ``path``.

    Args:
        path: a directory (created on first save); it becomes a store holding one run.
        durability: ``"sync"`` (default: ``save`` is durable when it returns),
            ``"async"`` or ``"exit"`` (see :mod:`afk_local.runner.writer`).
        enc_hook / dec_hook: msgspec hooks for types afk_local does not store itself
            (never pickle): ``enc_hook(obj)`` returns storable data and
            ``dec_hook(type, data)`` rebuilds the object (docs/runner.md, "What can be
            stored"). Pass the same pair to every StateCheckpoint of ``path``.

    The state holds storable values: msgpack data and the types of
    :mod:`afk_local.storage.format.values` (paths, datetimes, UUIDs, decimals, sets, enums,
    dataclasses, numpy arrays, pandas DataFrames, Arrow tables...) and whatever the
    hooks store; anything else raises
    :class:`~afk_local.errors.UnstorableValueError` naming where it is
    (``state.model.weights``). The first :meth:`save` takes the run's lock and holds it
    until :meth:`mark_complete`, :meth:`clear`, :meth:`close` or process exit.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: Durability = "sync",
        enc_hook: EncHook | None = None,
        dec_hook: DecHook | None = None,
    ) -> None:
        self.path = Path(path)
        if self.path.exists() and not self.path.is_dir():
            raise NotADirectoryError(
                f"StateCheckpoint path {self.path} is a file: give it a directory (it holds "
                "the checkpoint files)"
            )
        self.durability = durability
        self.store = Store(self.path, enc_hook=enc_hook, dec_hook=dec_hook)
        self._step: int | None = None
        # The key of this directory's shared writer, resolved once: resolving a path
        # costs a system call per component, more than the rest of a save's bookkeeping.
        self._key = self.path.resolve()

    def __repr__(self) -> str:
        return f"StateCheckpoint({str(self.path)!r}, status={self.status})"

    @property
    def status(self) -> str:
        """``"fresh"`` (nothing saved), ``"running"``, ``"completed"``, ..."""
        try:
            return str(self.store.read_meta(RUN_ID).status)
        except RunNotFoundError:
            return "fresh"

    @property
    def is_complete(self) -> bool:
        """True after :meth:`mark_complete`."""
        return self.status == RunStatus.COMPLETED.value

    def load(self, *, on_damage: OnDamage = "raise") -> Any:
        """The last saved state; None when nothing was saved yet or the work is complete.

        Args:
            on_damage: what to do when checkpoints exist but none of them can be read:
                ``"raise"`` (default) raises
                :class:`~afk_local.errors.CheckpointCorruptionError` naming the damaged
                files, so ``ckpt.load() or {...}`` never silently starts over;
                ``"fresh"`` returns None, as if nothing had been saved. A damaged newest
                file with an older readable one is never an error: the older one is
                returned and the skipped file logged.
        """
        if on_damage not in ("raise", "fresh"):
            raise ValueError("on_damage must be 'raise' or 'fresh'")
        writer = self._writer(create=False)
        if writer is not None:
            writer.flush()
        try:
            reader = self.store.open(RUN_ID)
        except RunNotFoundError:
            return None
        resume = reader.resume_state(on_corrupt="fallback")
        if resume.checkpoint is None and resume.skipped and on_damage == "raise":
            names = ", ".join(skip.name for skip in resume.skipped)
            raise CheckpointCorruptionError(
                str(self.path / "runs" / RUN_ID),
                f'no saved state can be read (damaged: {names}); load(on_damage="fresh") '
                "starts over from nothing",
                run_id=RUN_ID,
                root=str(self.path),
            )
        if resume.terminal or resume.checkpoint is None:
            return None
        self._step = resume.checkpoint.step
        return resume.checkpoint.payload

    def save(self, state: Any) -> None:
        """Persist ``state``: durable on return in ``sync`` mode, never torn by a crash.

        Raises:
            StoreMovedError: the directory was copied or moved since the run began
                (``afk-local --root PATH adopt`` makes the new place its home).
        """
        writer = self._writer(create=True)
        assert writer is not None
        if self._step is None:
            latest = writer.run.reader().latest()
            self._step = latest.step if latest is not None else 0
        self._step += 1
        try:
            writer.checkpoint(Phase.RUNTIME_STATE, state, step=self._step)
        except UnstorableValueError as exc:
            where = exc.under("state")
            kind = IntOutOfRangeError if isinstance(where, IntOutOfRangeError) else None
            raise (kind or UnstorableValueError)(where.path, where.type_name) from None

    def mark_complete(self, result: Any = None) -> None:
        """Record that the work is done, with its ``result``; :meth:`load` then returns None."""
        writer = self._writer(create=True)
        assert writer is not None
        try:
            writer.finish(result)
        finally:
            self.close()

    def get_result(self) -> Any:
        """The result given to :meth:`mark_complete`, or None while not complete."""
        try:
            reader = self.store.open(RUN_ID)
        except RunNotFoundError:
            return None
        if reader.meta.status is not RunStatus.COMPLETED:
            return None
        return reader.resume_state().result

    def clear(self) -> None:
        """Forget everything saved here (the run's files are deleted); the next load is None."""
        self.close()
        self._step = None
        with contextlib.suppress(RunNotFoundError):
            self.store.delete(RUN_ID)

    def close(self) -> None:
        """Write what is queued and release the lock (also done at process exit)."""
        with _open_lock:
            writer = _open_writers.pop(self._key, None)
        if writer is not None:
            writer.close()

    def __enter__(self) -> StateCheckpoint:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _writer(self, *, create: bool) -> DurableWriter | None:
        key = self._key
        with _open_lock:
            writer = _open_writers.get(key)
            if writer is not None and (writer.closed or writer.failed is not None):
                _open_writers.pop(key, None)
                writer = None
            if writer is not None or not create:
                return writer
            # once per writer, not per save; before it is opened, whose refusals (a
            # read-only or moved store) are what a script should end with in one line
            install_script_excepthook()
            if self.store.exists(RUN_ID):
                run = self.store.resume_writer(RUN_ID)
                if run.meta.status.is_terminal:  # saving again after completion starts over
                    run.update_meta(status=RunStatus.RUNNING, error=None, pause=None)
            else:
                # No entrypoint: nothing can resume a plain loop but the loop itself,
                # so a watcher must leave this run alone.
                run = self.store.create(RUN_ID, extra={"kind": "StateCheckpoint"})
            writer = DurableWriter(run, self.durability)
            _open_writers[key] = writer
            return writer


@atexit.register
def _close_all() -> None:
    with _open_lock:
        writers = list(_open_writers.values())
        _open_writers.clear()
    for writer in writers:
        try:
            writer.close()
        except Exception:  # noqa: S112 - best effort at exit; the error was logged by the writer
            continue
