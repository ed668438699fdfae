"""Settling an effect left in doubt: a person checked the outside system and says what happened.

A call a crash cut short has an intent and no outcome in the run's journal: it
may or may not have happened, so a resume refuses to guess (``in_doubt="raise"``)
and the run is marked failed. Once someone has checked (by the call's idempotency
key), :func:`settle` records the outcome like any other, journaled and durable:

- ``done``: it happened. Resuming replays it with ``result`` (given explicitly,
  ``None`` included), the call is not made again.
- ``failed``: it did not happen. Recorded as an error outcome; the next attempt
  calls it again, as it does for any step that raised (with the same idempotency key).

A mistake can be taken back: :func:`unsettle` (``afk-local settle RUN KEY --undo``)
re-records the call's intent, so it is in doubt again and can be settled anew, as
long as no resume has started since the settlement (a resume may have used it).

Settling works on failed and interrupted runs alike; it takes the run's lock, so
never while a process is running it. What it would refuse is refused from the run's
files first, before the lock is taken, so a refused settlement writes nothing (not
even ``run.meta``). ``afk-local settle RUN KEY`` calls this.
"""

from __future__ import annotations

import enum
from typing import Any

from afk_local.errors import SettleError
from afk_local.journal.journal import EffectState, Journal, journal_of
from afk_local.journal.replay import idempotency_key
from afk_local.storage.format.records import Effect, ErrorInfo, now_ms
from afk_local.storage.store import Store, StoreLike, as_store

SETTLED_FAILED = "SettledAsFailed"
"""The error type recorded for an effect settled as ``failed``."""


class _NoResult(enum.Enum):
    NO_RESULT = "no result"


_NO_RESULT = _NoResult.NO_RESULT


def settle(
    run_id: str,
    key: str,
    *,
    store: StoreLike = None,
    done: bool,
    result: Any = _NO_RESULT,
    message: str | None = None,
) -> Effect:
    """Record the outcome of the in-doubt effect ``key`` of run ``run_id``; returns the record.

    Args:
        done: True: the call happened (it will be replayed with ``result``);
            False: it did not (the next attempt calls it again).
        result: what the call returned, for ``done`` (msgpack-able data); required
            with ``done``, so that a forgotten result is never replayed as ``None``.
        message: why it failed, for not ``done`` (shown by ``afk-local effects``).

    Raises:
        RunNotFoundError: no such run.
        RunLockedError: a process is running it now.
        SettleError: no effect ``key`` in the run, or it is not in doubt, or ``done``
            without ``result``.
    """
    if done and result is _NO_RESULT:
        raise SettleError(
            run_id,
            key,
            "settling as done needs the result the call returned, replayed by the resume: "
            f"`afk-local settle {run_id} {key} --done --result JSON` (`--result null` when "
            "it returned nothing)",
        )
    the_store = as_store(store)
    _refuse_settle(run_id, key, *_on_disk(the_store, run_id, key))
    with the_store.resume_writer(run_id, new_attempt=False) as run:
        journal = journal_of(run)
        state = _effect_state(journal, run_id, key)
        _refuse_settle(run_id, key, state.outcome if not state.in_doubt else None, run.meta.attempt)
        attempt = max(run.meta.attempt, 1)
        if done:
            return journal.record_outcome(key, status="ok", result=result, settled_attempt=attempt)
        error = ErrorInfo(type=SETTLED_FAILED, message=message or "settled as not done")
        return journal.record_outcome(key, status="error", error=error, settled_attempt=attempt)


def _on_disk(store: Store, run_id: str, key: str) -> tuple[Effect | None, int]:
    """Effect ``key``'s recorded outcome (None: in doubt) and the run's attempt, read from
    its files without taking its lock; refused when the run has no effect ``key``."""
    reader = store.open(run_id)
    last: Effect | None = None
    for record in reader.effects():
        if record.key == key:
            last = record
    if last is None:
        raise SettleError(
            run_id,
            key,
            f"the run has no effect {key!r}: run `afk-local effects {run_id}` to list them",
        )
    return (last if last.kind == "outcome" else None), reader.meta.attempt


def _refuse_settle(run_id: str, key: str, outcome: Effect | None, attempt: int) -> None:
    """Refuse to settle an effect whose ``outcome`` is recorded (None: it is in doubt)."""
    if outcome is None:
        return
    raise SettleError(
        run_id,
        key,
        f"effect {key!r} is not in doubt: its outcome is recorded ({outcome.status}), "
        "so there is nothing to settle"
        + (
            f"; to take back that settlement, `afk-local settle {run_id} {key} --undo`"
            if _settlement(outcome) == max(attempt, 1)
            else ""
        ),
    )


def _refuse_unsettle(run_id: str, key: str, outcome: Effect | None, attempt: int) -> None:
    """Refuse to take back what no person settled during the run's current ``attempt``."""
    if outcome is None:
        raise SettleError(run_id, key, f"effect {key!r} is in doubt already: settle it")
    settled_at = _settlement(outcome)
    if settled_at is None:
        raise SettleError(
            run_id,
            key,
            f"effect {key!r} was not settled by hand: its outcome was recorded by the "
            "call itself, and only a settlement can be undone",
        )
    if max(attempt, 1) != settled_at:
        raise SettleError(
            run_id,
            key,
            f"a resume has started since effect {key!r} was settled and may have used its "
            "outcome, so the settlement stands; fork the run from before it "
            f"(`afk-local log {run_id}`, `afk-local fork {run_id} --at SEQ`) to try another",
        )


def _effect_state(journal: Journal, run_id: str, key: str) -> EffectState:
    """What the journal knows of effect ``key``; refused when the run has none."""
    state = journal.lookup(key)
    if state is None:
        raise SettleError(
            run_id,
            key,
            f"the run has no effect {key!r}: run `afk-local effects {run_id}` to list them",
        )
    return state


def _settlement(outcome: Effect | None) -> int | None:
    """The attempt at which a person recorded ``outcome``; None when the call recorded it."""
    if outcome is None or outcome.settled_attempt <= 0:
        return None
    return outcome.settled_attempt


def unsettle(run_id: str, key: str, *, store: StoreLike = None) -> Effect:
    """Take back the settlement of effect ``key``: it is in doubt again; returns the new intent.

    Allowed while no resume has started since the settlement (a resume may have
    replayed it and gone on with its result). Settle it again afterwards
    (:func:`settle`), or resume with ``in_doubt="retry"``.

    Raises:
        RunNotFoundError: no such run.
        RunLockedError: a process is running it now.
        SettleError: no effect ``key``, its outcome was not settled by a person, or a
            resume has started since.
    """
    the_store = as_store(store)
    _refuse_unsettle(run_id, key, *_on_disk(the_store, run_id, key))
    with the_store.resume_writer(run_id, new_attempt=False) as run:
        journal = journal_of(run)
        state = _effect_state(journal, run_id, key)
        _refuse_unsettle(run_id, key, None if state.in_doubt else state.outcome, run.meta.attempt)
        intent = state.intent
        reopened = Effect(
            kind="intent",
            key=key,
            timestamp_ms=now_ms(),
            step=intent.step if intent is not None else 0,
            call_id=intent.call_id if intent is not None else None,
            name=intent.name if intent is not None else "",
            input_hash=state.input_hash,
            idempotency_key=(
                intent.idempotency_key if intent is not None else idempotency_key(run_id, key)
            ),
            reopened=True,
        )
        journal.append(reopened)
        return reopened


__all__ = ["SETTLED_FAILED", "settle", "unsettle"]
