"""A run's journal served to the job's current code, nothing called: the replay check.

A :class:`ReplayJournal` is a read-only :class:`~afk_local.journal.journal.Journal`
whose :meth:`~ReplayJournal.call` never calls its function. A call the run recorded
with the same input hash gets its recorded result; anything else ends the replay:

- the code asks a call the run recorded with other arguments: a divergence
  (``"arguments"``);
- the code asks a call the run never recorded while a recorded one is still
  waiting to be asked: a divergence (``"step"``: renamed, inserted or reordered
  past a recorded call). A call whose recorded outcome is an error need not be
  asked again (the fix of the bug that failed the run may drop it);
- the code asks a call the run never recorded once every recorded call was asked,
  or one the run left in doubt or failed (a resume would call it again): the
  *frontier*, where a live attempt would take over (:class:`ReplayFrontier`).

Calls are matched by key (``name#n`` within a loop item), so steps that ran
concurrently (``astep`` under ``asyncio.gather``) may have been journaled in any
order. The first divergence is kept on the journal (:attr:`ReplayJournal.divergence`)
as well as raised, so job code that catches ``Exception`` cannot hide it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from afk_local.errors import ReplayDivergence
from afk_local.journal.journal import InDoubtPolicy, Journal
from afk_local.journal.replay import input_hash, render_args, render_call, replayed_error
from afk_local.storage.format import values
from afk_local.storage.format.codec import EncHook
from afk_local.storage.format.records import Effect, ErrorInfo

PATCH_PREFIX = "@patched:"
"""Journal keys of ``ctx.patched`` decisions start with this (``@patched:fee#1``)."""


def is_patch_key(key: str) -> bool:
    """True for the journal key of a ``ctx.patched`` decision (``iterate#1[0]/@patched:fee#1``)."""
    return key.rpartition("/")[2].startswith(PATCH_PREFIX)


def patch_id_of(key: str) -> str:
    """The patch id a decision's key holds: ``fee`` for ``iterate#1[0]/@patched:fee#1``."""
    return key.rpartition("/")[2].removeprefix(PATCH_PREFIX).rpartition("#")[0]


RETRY_MARK = "@retry"
"""How a retried step's backoff is keyed: ``<step key>@retry<n>`` (runner/time/retry.py)."""


class ReplayFrontier(BaseException):
    """The replayed code reached the end of what the run recorded: a resume goes live here.

    A BaseException, so that the job's own ``except Exception`` does not catch it.
    """

    def __init__(self, key: str, why: str) -> None:
        self.key = key
        self.why = why
        super().__init__(f"{key} ({why})")


@dataclass(frozen=True)
class RecordedCall:
    """One call the run journaled (its newest intent), in first-recorded order."""

    key: str
    name: str
    args_text: str
    input_hash: str

    def words(self) -> str:
        """The call in words: ``charge('a', 10)``."""
        return render_call(self.name, self.args_text, self.input_hash)


class ReplayJournal(Journal):
    """A run's ``effects.log`` opened read-only, serving recorded calls to replayed code.

    Args:
        path: the run's ``effects.log``.
        run_id: the run.
        record_codec: the store's codec (a keyed store's signatures are checked).
    """

    replaying = True

    def __init__(self, path: Any, run_id: str, *, record_codec: Any = None, **options: Any) -> None:
        super().__init__(path, run_id, writable=False, record_codec=record_codec, **options)
        self._guard = threading.Lock()
        self.recorded: list[RecordedCall] = self._recorded_calls()
        self._position = {call.key: index for index, call in enumerate(self.recorded)}
        self._reached: set[str] = set()
        self.divergence: ReplayDivergence | None = None
        """The first divergence met (also raised where it was met)."""
        self.frontier: ReplayFrontier | None = None
        """Where the replay reached the end of the recorded calls, if it did."""
        self.patch_decisions: dict[str, bool] = {}
        """``ctx.patched`` decisions the replay made (key -> decision), none journaled."""

    def _recorded_calls(self) -> list[RecordedCall]:
        calls = []
        for key in self.keys():
            state = Journal.lookup(self, key)
            intent = state.intent if state is not None else None
            if intent is None or is_patch_key(key):
                continue  # outcome-only records (a limit's start, a patch decision)
            if state is not None and state.status == "error":
                continue  # a call that failed: a resume calls it again, or a fix drops it
            calls.append(RecordedCall(key, intent.name, intent.args_text, intent.input_hash))
        return calls

    # -- what the replayed code asks ------------------------------------------------

    def lookup(self, key: str) -> Any:
        """As :meth:`Journal.lookup`; a recorded call looked up counts as reached (a pause
        answered earlier is looked up, not called)."""
        state = super().lookup(key)
        if state is not None and key in self._position:
            with self._guard:
                self._reached.add(key)
        return state

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
        """The recorded outcome of ``key``, never calling ``fn``; else a divergence or the
        frontier (see the module docstring)."""
        kwargs = dict(kwargs or {})
        args = tuple(args)
        call_name = name if name is not None else getattr(fn, "__name__", type(fn).__name__)
        hook = values.hash_hook(enc_hook) if enc_hook is not None else self._hash_hook
        digest = input_hash(call_name, args, kwargs, enc_hook=hook)
        state = super().lookup(key)
        if state is not None and state.input_hash and state.input_hash != digest:
            asked = render_call(call_name, render_args(args, kwargs))
            raise self._diverged(key, self.recorded_call(state), asked, "arguments")
        if state is None or (not state.input_hash and state.status is None):
            self._new_call(key, render_call(call_name, render_args(args, kwargs)))
        assert state is not None
        self.lookup(key)  # reached
        if state.in_doubt:
            raise self.frontier_at(key, "in doubt in the run")
        outcome = state.outcome
        assert outcome is not None
        if outcome.status == "ok":
            self.replayed_count += 1
            if result_type is not None:
                return msgspec.convert(values.as_data(outcome.result), result_type)
            return outcome.result
        if retry_errors:
            raise self.frontier_at(key, "failed in the run")
        self.replayed_count += 1
        info = outcome.error or ErrorInfo(type="ReplayedError", message="recorded error")
        raise replayed_error(info, key)

    def _new_call(self, key: str, asked: str) -> None:
        """The code asks ``key``, which the run never recorded: diverged, or live from here."""
        pending = self.first_unreached()
        if pending is not None:
            raise self._diverged(pending.key, pending.words(), asked, "step")
        raise self.frontier_at(key, "past the run's journal")

    def first_unreached(self) -> RecordedCall | None:
        """The first recorded call the code has not asked yet, or None."""
        with self._guard:
            for call in self.recorded:
                if call.key not in self._reached and not self._backoff_behind(call.key):
                    return call
        return None

    def _backoff_behind(self, key: str) -> bool:
        """``key`` is a backoff between two earlier tries of a retried step (``<step
        key>@retry<n>``) whose step the code has reached: a resume asks only the backoff
        owed after the newest try (it counts the tries from the step's record), so the
        earlier ones are behind it, not skipped. Called under ``_guard``."""
        step, sep, n = key.rpartition(RETRY_MARK)
        return bool(sep) and n.isdigit() and step in self._reached

    def position_of(self, key: str) -> int:
        """The 1-based position of the recorded call ``key`` (past the end when unrecorded)."""
        return self._position.get(key, len(self.recorded)) + 1

    def passed(self) -> bool:
        """True when the run recorded calls the code has not reached yet (it went past here)."""
        return self.first_unreached() is not None

    def finished(self) -> None:
        """The replayed job returned: every recorded call must have been asked."""
        pending = self.first_unreached()
        if pending is not None:
            raise self._diverged(
                pending.key, pending.words(), "nothing (the job ends without it)", "missing"
            )

    def _diverged(self, key: str, recorded: str, asked: str, kind: str) -> ReplayDivergence:
        position = self.position_of(key)
        divergence = ReplayDivergence(self.run_id, position, key, recorded, asked, kind=kind)
        with self._guard:
            if self.divergence is None:
                self.divergence = divergence
        return divergence

    def frontier_at(self, key: str, why: str) -> ReplayFrontier:
        """The frontier at ``key`` (kept, and returned for the caller to raise)."""
        frontier = ReplayFrontier(key, why)
        with self._guard:
            if self.frontier is None:
                self.frontier = frontier
        return frontier

    # -- nothing is written ---------------------------------------------------------

    def append(self, effect: Effect, *, enc_hook: EncHook | None = None) -> None:
        """A replay writes nothing: a record the code would append marks the frontier."""
        raise self.frontier_at(effect.key, "the code would write to the journal here")


__all__ = [
    "PATCH_PREFIX",
    "RecordedCall",
    "ReplayFrontier",
    "ReplayJournal",
    "is_patch_key",
    "patch_id_of",
]
