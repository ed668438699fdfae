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
from pathlib import Path
from typing import Any, Protocol

import msgspec

from afk_local.errors import (
    EffectInDoubtError,
    EffectMismatchError,
    ForkedWriterError,
    WriterFailedError,
)
from afk_local.journal.replay import (
    accepts_idempotency_key,
    idempotency_key,
    input_hash,
    render_args,
    render_call,
    replayed_error,
    result_hash,
)
from afk_local.storage import fsio
from afk_local.storage.format import values
from afk_local.storage.format.codec import EncHook, RecordCodec
from afk_local.storage.format.frames import FRAME_HEADER_SIZE, MAX_FRAME_BYTES, encode_frame
from afk_local.storage.format.integrity import MAC_SIZE, NO_MAC, Signer, record_digest
from afk_local.storage.format.journal_format import (
    DEFAULT_MAX_FRAME_BYTES,
    EffectHead,
    FrameReader,
    RecordOrder,
    TornTail,
)
from afk_local.storage.format.records import Effect, ErrorInfo, error_info, now_ms

log = logging.getLogger("afk_local")


InDoubtPolicy = str | Callable[["EffectState"], str]


class _Entry:
    """Index slot for one key: offsets, not records, so memory stays small."""

    __slots__ = ("attempts", "input_hash", "intent_at", "outcome_at", "status")

    def __init__(self) -> None:
        self.intent_at: tuple[int, int] | None = None  # (offset, length) of the newest intent
        self.outcome_at: tuple[int, int] | None = None  # its outcome, if any
        self.input_hash = ""
        self.status: str | None = None
        self.attempts = 0


class EffectState:
    """What the journal knows about one key. The records are read from disk on first use."""

    __slots__ = ("_entry", "_intent", "_journal", "_outcome", "key")

    def __init__(self, journal: Journal, key: str, entry: _Entry) -> None:
        self.key = key
        self._journal = journal
        self._entry = entry  # live: later records of the key show up here
        self._intent: tuple[tuple[int, int], Effect] | None = None
        self._outcome: tuple[tuple[int, int], Effect] | None = None

    @property
    def intent(self) -> Effect | None:
        """The newest intent record of the key (None for an outcome written without one)."""
        at = self._entry.intent_at
        if at is None:
            return None
        if self._intent is None or self._intent[0] != at:
            self._intent = (at, self._journal._read_record(*at))
        return self._intent[1]

    @property
    def outcome(self) -> Effect | None:
        """The outcome of the newest intent, or None while in doubt."""
        at = self._entry.outcome_at
        if at is None:
            return None
        if self._outcome is None or self._outcome[0] != at:
            self._outcome = (at, self._journal._read_record(*at))
        return self._outcome[1]

    @property
    def in_doubt(self) -> bool:
        """True when the call started (intent durable) but no outcome was recorded."""
        return self._entry.intent_at is not None and self._entry.outcome_at is None

    @property
    def status(self) -> str | None:
        """The outcome's status (``"ok"`` / ``"error"``) without reading it, or None."""
        return self._entry.status

    @property
    def input_hash(self) -> str:
        """The input hash of the newest intent (``""`` when there is none)."""
        return self._entry.input_hash

    @property
    def attempts(self) -> int:
        """How many intents were recorded for this key (retries included)."""
        return self._entry.attempts

    def __repr__(self) -> str:
        state = "in doubt" if self.in_doubt else (self.status or "no intent")
        return f"EffectState(key={self.key!r}, {state}, attempts={self.attempts})"


class AppendListener(Protocol):
    """Told about a writable journal's appends (a run's remote mirror satisfies it)."""

    def before_append(self) -> None:
        """Called before a record is appended; raising refuses the append."""

    def synced(self, end: int) -> None:
        """Called after an fsync: the file is durable up to byte ``end``. Must not block."""

    def appended(self, end: int) -> None:
        """Called in the appending thread once its record (ending at byte ``end``) is
        durable, outside the journal's lock: the one place a listener may wait, and
        raising here fails that append (a mirror that keeps effects remote-durable)."""


class Journal:
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

    def __init__(
        self,
        path: str | os.PathLike[str],
        run_id: str,
        *,
        writable: bool,
        record_codec: RecordCodec | None = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        listener: AppendListener | None = None,
        on_durable: Callable[[int, bytes], None] | None = None,
        env: fsio.Env = fsio.DEFAULT_ENV,
    ) -> None:
        self.path = Path(path)
        self._env = env
        self._listener = listener
        self._on_durable = on_durable
        self._tail = b""  # the last bytes written (up to MAC_SIZE): what on_durable reports
        self.run_id = run_id
        self.writable = writable
        self._pid = os.getpid()  # appends belong to the process that opened it, never a fork
        self.torn_tail: TornTail | None = None
        self.replayed_count = 0
        """How many :meth:`call` invocations this instance replayed instead of executing."""
        self._codec = record_codec or RecordCodec()
        self._signer: Signer | None = self._codec.signer
        self._last_mac = NO_MAC  # the chain value the next signed record links to
        self.signed_count = 0
        """How many records carry a signature (checked only in a keyed store)."""
        self._hash_hook: EncHook = self._codec.hash_hook
        self._max_frame = min(max_frame_bytes, MAX_FRAME_BYTES)
        self._index: dict[str, _Entry] = {}
        self._count = 0
        self._cond = threading.Condition(threading.Lock())
        self._failed: BaseException | None = None
        self._closed = False
        self._syncing = False
        self._pending: list[tuple[int, int, EffectHead]] = []  # written, not yet fsynced
        self._in_flight: dict[str, int] = {}  # key -> the thread running its call
        self._order = RecordOrder(str(path), run_id)
        self._fd = self._open()
        self._frames = FrameReader(
            self._fd,
            self.path,
            run_id,
            self._max_frame,
            self._signer,
            ext_hook=self._codec.ext_hook,
        )
        try:
            self._end = self._load()
        except BaseException:
            os.close(self._fd)
            raise
        self._written_end = self._synced_end = self._end
        if self._fd >= 0 and self._end:
            start = max(self._end - MAC_SIZE, 0)
            self._tail = os.pread(self._fd, self._end - start, start)

    def _open(self) -> int:
        if not self.writable:
            try:
                return fsio.open_regular(self.path)
            except FileNotFoundError:
                return -1  # no journal yet: an empty view
        existed = self.path.exists()
        fd = self._env.open_append(self.path)
        if not existed:
            try:
                self._env.fsync_dir(self.path.parent)  # the new entry must survive a crash too
            except BaseException:
                os.close(fd)
                raise
        return fd

    # -- opening ------------------------------------------------------------------

    def _load(self) -> int:
        if self._fd < 0:
            return 0
        scan = self._frames.scan(os.fstat(self._fd).st_size, self._apply)
        if self._frames.order is not None:
            self._order = self._frames.order
        self._last_mac = scan.last_mac
        self.signed_count = scan.signed_count
        torn = self.torn_tail = scan.torn_tail
        if torn is None:
            return scan.end
        if self.writable:
            self._env.truncate(self._fd, torn.offset, self.path)
        log.warning(
            "run %s: %s: torn tail %s: %d byte(s) at offset %d (%s)",
            self.run_id,
            self.path,
            "repaired (truncated)" if self.writable else "ignored",
            torn.dropped_bytes,
            torn.offset,
            torn.reason,
        )
        return torn.offset

    def _apply(self, offset: int, length: int, head: EffectHead) -> None:
        entry = self._index.get(head.key)
        if entry is None:
            entry = self._index[head.key] = _Entry()
        if head.kind == "intent":
            entry.intent_at = (offset, length)
            entry.outcome_at = None  # an outcome belongs to the intent before it
            entry.input_hash = head.input_hash
            entry.status = None
            entry.attempts += 1
        else:
            entry.outcome_at = (offset, length)
            entry.status = head.status
        self._count += 1

    def _read_record(self, offset: int, length: int) -> Effect:
        # ``length``: the frame's size after its header (msgpack bytes and any MAC).
        if self._closed:
            raise ValueError(f"journal {self.path} is closed")
        return self._frames.read_record(offset, length)

    # -- reading ------------------------------------------------------------------

    def lookup(self, key: str) -> EffectState | None:
        """What is known about ``key`` (None when nothing was recorded). O(1)."""
        entry = self._index.get(key)
        return None if entry is None else EffectState(self, key, entry)

    def keys(self) -> list[str]:
        """Every key with a record, in the order first recorded."""
        return list(self._index)

    def __len__(self) -> int:
        """The number of durable records (intents and outcomes)."""
        return self._count

    def in_doubt(self) -> list[EffectState]:
        """Every key whose newest intent has no outcome (the call may or may not have run)."""
        return [
            EffectState(self, key, entry)
            for key, entry in self._index.items()
            if entry.intent_at is not None and entry.outcome_at is None
        ]

    def records(self) -> Iterator[Effect]:
        """Every durable record in file order, read lazily from disk (signatures re-checked)."""
        if self._closed:
            raise ValueError(f"journal {self.path} is closed")
        if self._fd < 0:
            return
        yield from self._frames.records(self._synced_end)

    def recorded_call(self, state: EffectState) -> str:
        """The call ``state``'s newest intent recorded, in words (``charge('a', 10)``)."""
        intent = state.intent
        if intent is None:
            return f"{state.key} (an outcome without a recorded call)"
        return render_call(intent.name, intent.args_text, intent.input_hash)

    # -- writing ------------------------------------------------------------------

    def append(self, effect: Effect, *, enc_hook: EncHook | None = None) -> None:
        """Append one record and return once it is on stable storage. Thread-safe.

        Appends that arrive while another thread's fsync is in flight are
        covered together by the next fsync (group commit); none returns before
        the fsync covering its bytes returned. A failed write or fsync makes the
        journal refuse every later append (:class:`WriterFailedError`).
        """
        if not self.writable:
            raise ValueError(f"journal {self.path} of run {self.run_id!r} is open read-only")
        self._check_process()
        if self._listener is not None:
            self._listener.before_append()
        body = self._codec.encode(effect, enc_hook=enc_hook)
        if len(body) > self._max_frame:
            raise ValueError(
                f"run {self.run_id!r}: effect {effect.key!r} record is {len(body)} bytes, over "
                f"max_frame_bytes={self._max_frame}; return a smaller result (store large data "
                "in a file and journal its path)"
            )
        head = EffectHead(effect.kind, effect.key, effect.input_hash, effect.status)
        digest = None if self._signer is None else record_digest(body)
        frame = encode_frame(body) if digest is None else b""
        with self._cond:
            self._check_writable()
            problem = self._order.problem(head)
            if problem is not None:  # readers would refuse the file (RecordOrder)
                raise ValueError(f"run {self.run_id!r}: {problem}: refused, nothing was written")
            self._order.note(head)
            mac = None
            if self._signer is not None and digest is not None:
                # The chain follows file order, so the MAC is made under the append lock.
                mac = self._signer.effect_mac(self.run_id, self._last_mac, digest)
                frame = encode_frame(body, mac)
            offset = self._written_end
            try:
                self._env.write_all(self._fd, frame, self.path)
            except BaseException as exc:
                self._failed = exc
                self._cond.notify_all()
                self._discard_unsynced_locked()
                raise WriterFailedError(self.run_id, exc) from exc
            if mac is not None:
                self._last_mac = mac
            self._tail = (self._tail + frame)[-MAC_SIZE:]
            self._written_end = mine = offset + len(frame)
            self._pending.append((offset, len(frame) - FRAME_HEADER_SIZE, head))
            while self._synced_end < mine:
                if self._failed is not None:
                    raise WriterFailedError(self.run_id, self._failed)
                if self._closed:  # never fsync a descriptor that close() gave back
                    raise WriterFailedError(self.run_id, RuntimeError("journal closed meanwhile"))
                if self._syncing:
                    self._cond.wait()
                    continue
                self._sync_locked()
        if self._listener is not None:
            self._listener.appended(mine)

    def _sync_locked(self) -> None:
        """Fsync everything written so far; called with the lock held, releases it meanwhile."""
        self._syncing = True
        target, tail = self._written_end, self._tail
        batch, self._pending = self._pending, []
        self._cond.release()
        error: BaseException | None = None
        try:
            self._env.fsync_fd(self._fd, self.path)
        except BaseException as exc:
            error = exc
        finally:
            self._cond.acquire()
            self._syncing = False
        if error is not None:
            self._failed = error  # never retried: the kernel may have dropped the dirty pages
            self._cond.notify_all()
            self._discard_unsynced_locked()
            raise WriterFailedError(self.run_id, error) from error
        self._synced_end = target
        for offset, length, head in batch:  # the index only ever shows durable records
            self._apply(offset, length, head)
        if self._on_durable is not None:
            self._on_durable(target, tail)
        if self._listener is not None:
            self._listener.synced(target)
        self._cond.notify_all()

    def _discard_unsynced_locked(self) -> None:
        """After a failed write or fsync: cut the file back to its last durable byte.

        The bytes after it are still in the page cache, readable and crc-valid, but
        the disk may never get them (fsyncgate: after an fsync error the kernel may
        mark the lost pages clean, and a later fsync succeeds without writing them).
        Left in place, the next process to open the journal would take them as
        recorded: an outcome that may vanish would be replayed as done. Cut, a call
        whose outcome was lost is in doubt, as it is. Called with the lock held.
        """
        while self._syncing:  # an fsync in flight may still acknowledge what it covers
            self._cond.wait()
        try:
            self._env.truncate(self._fd, self._synced_end, self.path)
        except OSError as exc:
            log.error(
                "run %s: %s: could not cut the unacknowledged tail at offset %d: %s",
                self.run_id, self.path, self._synced_end, exc,
            )  # fmt: skip
        self._written_end = self._synced_end
        self._pending = []

    @property
    def failed(self) -> BaseException | None:
        """The write or fsync error that made this journal refuse appends, if any."""
        return self._failed

    def _check_process(self) -> None:
        if os.getpid() != self._pid:
            raise ForkedWriterError(self.run_id, self._pid, os.getpid())

    def _check_writable(self) -> None:
        if self._closed:
            raise WriterFailedError(self.run_id, RuntimeError(f"journal {self.path} is closed"))
        if self._failed is not None:
            raise WriterFailedError(self.run_id, self._failed)

    def record_intent(
        self,
        key: str,
        *,
        name: str,
        input_hash: str,
        idempotency_key: str,
        step: int = 0,
        call_id: str | None = None,
        args_text: str = "",
    ) -> Effect:
        """Durably record that the call ``key`` is about to run; returns the record.

        ``args_text``: its arguments in words (:func:`~afk_local.journal.replay.render_args`).
        """
        effect = Effect(
            kind="intent",
            key=key,
            timestamp_ms=now_ms(),
            step=step,
            call_id=call_id,
            name=name,
            input_hash=input_hash,
            idempotency_key=idempotency_key,
            args_text=args_text,
        )
        self.append(effect)
        return effect

    def record_outcome(
        self,
        key: str,
        *,
        status: str,
        result: Any = None,
        error: ErrorInfo | None = None,
        output_hash: str | None = None,
        enc_hook: EncHook | None = None,
        settled_attempt: int = 0,
    ) -> Effect:
        """Durably record how the call ``key`` ended: ``status`` ``"ok"`` or ``"error"``.

        For ``"ok"`` without ``output_hash``, the blake2b of the result's
        canonical msgpack is stored. ``settled_attempt``: a person recorded it
        (``afk-local settle``), at that attempt of the run.
        """
        if status not in ("ok", "error"):
            raise ValueError(f"status must be 'ok' or 'error', not {status!r}")
        hook = values.hash_hook(enc_hook) if enc_hook is not None else self._hash_hook
        if status == "ok" and output_hash is None:
            output_hash = result_hash(result, enc_hook=hook)
        effect = Effect(
            kind="outcome",
            key=key,
            timestamp_ms=now_ms(),
            status=status,
            output_hash=output_hash,
            result=result,
            error=error,
            settled_attempt=settled_attempt,
        )
        self.append(effect, enc_hook=enc_hook)
        return effect

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

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._closed

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
