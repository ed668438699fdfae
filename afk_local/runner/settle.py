"""Settling an effect left in doubt: a person checked the outside system and says what happened.

A call a crash cut short has an intent and no outcome in the run's journal: it
may or may not have happened, so a resume refuses to guess (``in_doubt="raise"``)
and the run is marked failed. Once someone has checked (by the call's idempotency
key), :func:`settle` records the outcome like any other, journaled and durable:

- ``done``: it happened. Resuming replays it with ``result``, the call is not made again.
- ``failed``: it did not happen. Recorded as an error outcome; the next attempt
  calls it again, as it does for any step that raised (with the same idempotency key).

Settling works on failed and interrupted runs alike; it takes the run's lock, so
never while a process is running it. ``afk-local settle RUN KEY`` calls this.
"""

from __future__ import annotations

from typing import Any

from afk_local.errors import SettleError
from afk_local.journal.journal import journal_of
from afk_local.storage.format.records import Effect, ErrorInfo
from afk_local.storage.store import StoreLike, as_store

SETTLED_FAILED = "SettledAsFailed"
"""The error type recorded for an effect settled as ``failed``."""


def settle(
    run_id: str,
    key: str,
    *,
    store: StoreLike = None,
    done: bool,
    result: Any = None,
    message: str | None = None,
) -> Effect:
    """Record the outcome of the in-doubt effect ``key`` of run ``run_id``; returns the record.

    Args:
        done: True: the call happened (it will be replayed with ``result``);
            False: it did not (the next attempt calls it again).
        result: what the call returned, for ``done`` (msgpack-able data).
        message: why it failed, for not ``done`` (shown by ``afk-local effects``).

    Raises:
        RunNotFoundError: no such run.
        RunLockedError: a process is running it now.
        SettleError: no effect ``key`` in the run, or it is not in doubt.
    """
    the_store = as_store(store)
    with the_store.resume_writer(run_id, new_attempt=False) as run:
        journal = journal_of(run)
        state = journal.lookup(key)
        if state is None:
            raise SettleError(
                run_id,
                key,
                f"the run has no effect {key!r}: run `afk-local effects {run_id}` to list them",
            )
        if not state.in_doubt:
            raise SettleError(
                run_id,
                key,
                f"effect {key!r} is not in doubt: its outcome is recorded ({state.status}), "
                "so there is nothing to settle",
            )
        if done:
            return journal.record_outcome(key, status="ok", result=result)
        error = ErrorInfo(type=SETTLED_FAILED, message=message or "settled as not done")
        return journal.record_outcome(key, status="error", error=error)


__all__ = ["SETTLED_FAILED", "settle"]
