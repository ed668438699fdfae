"""Appending to an ``effects.log``: one record at a time, made durable by group commit.

Records are written, then fsynced by whichever appender finds no sync running; a failed
fsync poisons the journal (every later append raises), and appends belong to the process
that opened the journal, never a fork.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from afk_local.errors import (
    ForkedWriterError,
    WriterFailedError,
)
from afk_local.journal.reading import JournalFile
from afk_local.journal.replay import (
    result_hash,
)
from afk_local.storage.format import values
from afk_local.storage.format.codec import EncHook
from afk_local.storage.format.frames import FRAME_HEADER_SIZE, encode_frame
from afk_local.storage.format.integrity import MAC_SIZE, record_digest
from afk_local.storage.format.journal_format import (
    EffectHead,
)
from afk_local.storage.format.records import Effect, ErrorInfo, now_ms

log = logging.getLogger("afk_local")


class JournalAppender(JournalFile):
    """Appends to the journal file: ``append``, ``record_intent``, ``record_outcome``."""

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
