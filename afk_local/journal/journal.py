"""The effect journal (``effects.log``): side effects happen once, or are reported in doubt.

A :class:`Journal` is an open ``effects.log``: an in-memory index of each
key's newest intent and outcome over the append-only file, appends made
durable with group commit, and :meth:`Journal.call`, which runs a function
at most once per key across crashes. A call is journaled in two records, an
``intent`` before the function runs and an ``outcome`` after it returned
(docs/journal.md). The frame format and the torn-tail decision live in
:mod:`afk_local.storage.format.journal_format`, input hashes and replayed errors in
:mod:`afk_local.journal.replay`; docs/journal.md describes the format and the
replay rules.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import msgspec

from afk_local.errors import (
    EffectInDoubtError,
    EffectMismatchError,
    WriterFailedError,
)
from afk_local.journal.appending import JournalAppender
from afk_local.journal.reading import AppendListener, EffectState
from afk_local.journal.replay import (
    accepts_idempotency_key,
    idempotency_key,
    input_hash,
    render_args,
    render_call,
    replayed_error,
)
from afk_local.storage.format import values
from afk_local.storage.format.codec import EncHook
from afk_local.storage.format.records import ErrorInfo, error_info

log = logging.getLogger("afk_local")


InDoubtPolicy = str | Callable[["EffectState"], str]


class Journal(JournalAppender):
    """An open ``effects.log``: an in-memory index over an append-only file.

    Opening scans the file once. A damaged last frame is a torn write from a
    crash: a writable journal truncates it, a read-only one ignores it; either
    way it is reported in :attr:`torn_tail`. A damaged frame with good frames
    after it raises :class:`EffectLogCorruptionError`.

    Args:
        path: the journal file (created 0600 when writable and missing).
        run_id: the run it belongs to (used in messages and idempotency keys).
        writable: open for appending; the caller must own the run's lock.
        record_codec: encodes records (its ``enc_hook`` applies to results).
        max_frame_bytes: largest record accepted on write and on read.
        listener: told before each append (it may refuse by raising) and after each
            fsync, with the durable end of the file (a remote mirror, say).
        on_durable: called as ``on_durable(end, tail)`` after each fsync, with the
            durable length of the file and its last 32 bytes (a keyed record's MAC):
            a keyed store's head record follows the journal this way.
        env: the I/O seam its writes go through (the store's; default: the process-wide).
    """

    replaying = False
    """True for a :class:`~afk_local.journal.replaying.ReplayJournal` (nothing is called)."""

    # Opening and reading: journal/reading.py; appending: journal/appending.py.

    # -- the replay logic -----------------------------------------------------------

    def call(
        self,
        key: str,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        name: str | None = None,
        step: int = 0,
        idempotent: bool | None = None,
        in_doubt: InDoubtPolicy | None = None,
        retry_errors: bool = False,
        enc_hook: EncHook | None = None,
        result_type: Any = None,
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` at most once per ``key`` across crashes and resumes.

        - An outcome recorded for ``key`` with the same input hash is replayed:
          its result is returned (as msgpack decoded it: lists for tuples, or
          converted to ``result_type``), or its error is raised again as a
          :class:`ReplayedError` of the same type name and message
          (``retry_errors=True`` runs the call again instead).
        - A different input hash raises :class:`EffectMismatchError`.
        - An intent without outcome is in doubt: ``in_doubt`` decides,
          ``"retry"`` (call again with the same idempotency key), ``"raise"``
          (:class:`EffectInDoubtError`) or a callable that gets the
          :class:`EffectState` and returns one of those. None means
          ``"retry"`` when the call is idempotent, else ``"raise"``. It is when
          ``idempotent=True``, and with ``idempotent=None`` (the default) when it
          carries an idempotency key: ``fn`` takes an ``idempotency_key``
          parameter (the service drops the duplicate) or ``kwargs`` holds one.
          ``idempotent=False`` keeps such a call in doubt.
        - Otherwise: intent (durable), call, outcome (durable), return.

        ``fn`` gets ``idempotency_key=...`` when its signature has a parameter
        of that name (``**kwargs`` alone does not count). The default ``name``
        is ``fn.__name__``; it is part of the input hash. Exceptions are
        recorded as error outcomes; BaseExceptions (KeyboardInterrupt,
        SystemExit) are not, leaving the call in doubt, as it may be.

        >>> journal.call("email:42", send_email, ("a@b.c", "hi"))  # doctest: +SKIP
        """
        if self.writable:
            self._check_process()  # before _calling's lock, which a parent's thread may hold
        kwargs = dict(kwargs or {})
        args = tuple(args)
        call_name = name if name is not None else getattr(fn, "__name__", type(fn).__name__)
        hook = values.hash_hook(enc_hook) if enc_hook is not None else self._hash_hook
        digest = input_hash(call_name, args, kwargs, enc_hook=hook)
        with self._calling(key):
            return self._call_claimed(
                key, fn, args, kwargs, call_name, digest, step, idempotent, in_doubt,
                retry_errors, enc_hook, result_type,
            )  # fmt: skip

    @contextlib.contextmanager
    def _calling(self, key: str) -> Iterator[None]:
        """Hold ``key`` for one call: a second thread calling the same key waits, then replays.

        Deciding (lookup) and executing happen under the claim, so two threads can
        never both find no record and both run the effect.
        """
        me = threading.get_ident()
        with self._cond:
            while key in self._in_flight:
                if self._in_flight[key] == me:
                    raise RuntimeError(
                        f"run {self.run_id!r}: effect {key!r} is already running in this thread "
                        "(a journaled call calls itself)"
                    )
                self._cond.wait()
            self._in_flight[key] = me
        try:
            yield
        finally:
            with self._cond:
                del self._in_flight[key]
                self._cond.notify_all()

    def _call_claimed(  # noqa: PLR0917 - private; the arguments of call()
        self,
        key: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        call_name: str,
        digest: str,
        step: int,
        idempotent: bool | None,
        in_doubt: InDoubtPolicy | None,
        retry_errors: bool,
        enc_hook: EncHook | None,
        result_type: Any,
    ) -> Any:
        state = self.lookup(key)
        if state is not None and state.input_hash and state.input_hash != digest:
            raise EffectMismatchError(
                self.run_id,
                key,
                self.recorded_call(state),
                render_call(call_name, render_args(args, kwargs)),
                str(self.path),
            )
        if state is not None and state.status is not None:
            outcome = state.outcome
            assert outcome is not None
            if outcome.status == "ok":
                self.replayed_count += 1
                if result_type is not None:
                    return msgspec.convert(values.as_data(outcome.result), result_type)
                return outcome.result
            if not retry_errors:
                self.replayed_count += 1
                info = outcome.error or ErrorInfo(type="ReplayedError", message="recorded error")
                raise replayed_error(info, key)
        elif state is not None and state.in_doubt:
            if idempotent is None:  # a call that carries its key may be repeated: the
                # service it goes to drops the duplicate
                idempotent = "idempotency_key" in kwargs or accepts_idempotency_key(fn)
            policy = in_doubt if in_doubt is not None else ("retry" if idempotent else "raise")
            decision = policy(state) if callable(policy) else policy
            if decision == "raise":
                raise EffectInDoubtError(
                    self.run_id, key, idempotency_key(self.run_id, key), str(self.path)
                )
            if decision != "retry":
                raise ValueError(f"in_doubt policy must give 'retry' or 'raise', not {decision!r}")
            log.warning(
                "run %s: effect %r was in doubt (started, no outcome); calling it again with "
                "idempotency key %s",
                self.run_id, key, idempotency_key(self.run_id, key),
            )  # fmt: skip
        return self._execute(key, fn, args, kwargs, call_name, digest, step, enc_hook)

    def _execute(  # noqa: PLR0917 - private; called from one place
        self,
        key: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        call_name: str,
        digest: str,
        step: int,
        enc_hook: EncHook | None,
    ) -> Any:
        idem = idempotency_key(self.run_id, key)
        self.record_intent(
            key,
            name=call_name,
            input_hash=digest,
            idempotency_key=idem,
            step=step,
            args_text=render_args(args, kwargs),
        )
        call_kwargs = kwargs
        if "idempotency_key" not in kwargs and accepts_idempotency_key(fn):
            call_kwargs = {**kwargs, "idempotency_key": idem}
        try:
            result = fn(*args, **call_kwargs)
        except Exception as exc:
            self.record_outcome(key, status="error", error=error_info(exc))
            raise
        try:
            self.record_outcome(key, status="ok", result=result, enc_hook=enc_hook)
        except (TypeError, msgspec.EncodeError, ValueError) as exc:
            raise TypeError(
                f"run {self.run_id!r}: effect {key!r} ran, but its result cannot be "
                f"journaled ({exc}); it stays in doubt. Return msgpack-able data or pass "
                "enc_hook"
            ) from exc
        return result

    # -- lifetime -----------------------------------------------------------------

    def close(self) -> None:
        """Close the file once appends in progress are durable (or failed). Idempotent.

        In a forked child it only closes the inherited descriptor: no lock (a parent's
        thread may have held it at the fork), no fsync.
        """
        if os.getpid() != self._pid:
            if not self._closed:
                self._closed = True
                if self._fd >= 0:
                    os.close(self._fd)
            return
        with self._cond:
            while self._syncing:
                self._cond.wait()
            if self._closed:
                return
            if self._failed is None and self._written_end > self._synced_end:
                with contextlib.suppress(WriterFailedError):  # kept in _failed; close anyway
                    self._sync_locked()
            self._closed = True
            if self._fd >= 0:
                os.close(self._fd)

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "writable" if self.writable else "read-only"
        return f"Journal(run_id={self.run_id!r}, path={str(self.path)!r}, {mode}, n={self._count})"


__all__ = [
    "AppendListener",
    "EffectState",
    "InDoubtPolicy",
    "Journal",
    "journal_of",
]


class _HasEffects(Protocol):
    @property
    def effects(self) -> object: ...


def journal_of(run: _HasEffects) -> Journal:
    """``run.effects`` typed as the :class:`Journal` it is.

    A run's writer (storage, the layer below the journal) hands out its journal
    through a seam and may not name this class; code above the journal uses this.
    """
    journal = run.effects
    if not isinstance(journal, Journal):
        raise TypeError(f"{type(journal).__name__} is not an afk_local Journal")
    return journal
