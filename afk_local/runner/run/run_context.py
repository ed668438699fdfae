"""What a durable job runs with: :class:`RunContext` (``step``, ``state``, ``iterate``, ``pause``).

``ctx.step`` routes a call through the run's effect journal (replayed on
resume), ``ctx.state`` is checkpointed with the loop positions of
``ctx.iterate``, and ``ctx.pause`` waits for a person. The job function
re-runs from the top on every attempt; these make that cheap and safe.
``ctx.metric``, ``ctx.progress`` and ``ctx.tags`` say how the run is doing
(:mod:`.run_report`, :mod:`.tags`). Steps live in :mod:`.steps`, loops in
:mod:`.iterating`, durable time in :mod:`afk_local.runner.time.durable_time`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import msgspec

from afk_local.errors import ReplayDivergence, RunPaused, UnstorableValueError
from afk_local.journal.journal import Journal
from afk_local.journal.replaying import PATCH_PREFIX, ReplayJournal
from afk_local.runner.observe.observe import AttemptObservation
from afk_local.runner.observe.run_report import Reporting, RunReport
from afk_local.runner.run.iterating import Iterating
from afk_local.runner.run.loops import Scope
from afk_local.runner.run.steps import Steps, set_step_hook
from afk_local.runner.run.tags import SLOT_TAG_KEY, RunTags
from afk_local.runner.time.durable_time import DurableTime
from afk_local.runner.writer import DurableWriter
from afk_local.storage.format.records import Phase
from afk_local.storage.store import Store
from afk_local.storage.views.run_info import tags_of
from afk_local.storage.views.run_progress import PROGRESS_KEY

NO_INPUT: Any = object()
"""The ``input_value`` of an attempt that answers no pause."""
PAUSE_NAME = "@pause"
"""The name of the journaled call that holds a pause's answer (the effects show it)."""
_PAUSE = PAUSE_NAME
_RUNTIME_STATE = Phase.RUNTIME_STATE.value  # a str: its hash is C's, an Enum member's is not


class RunContext(Iterating, Steps, Reporting, DurableTime):
    """What a durable function gets as its first argument.

    Attributes:
        run_id: the run's id.
        attempt: 1 for the first process that ran it, +1 for every resume.
        resumed: True when this call continues an earlier attempt.
        state: a dict of msgpack-able data saved with every checkpoint and
            restored on resume (initialise it with ``setdefault``: the function
            re-runs from the top).
        store: the store the run lives in.
        park_after: a ``sleep`` (or retry backoff) longer than this many seconds
            parks the run (see :meth:`sleep`); None never parks.
    """

    def __init__(
        self,
        writer: DurableWriter,
        store: Store,
        *,
        state: dict[str, Any],
        cursors: dict[str, Any],
        version: str | None,
        attempt: int,
        resumed: bool,
        input_value: Any = NO_INPUT,
        in_doubt: Any = None,
        report: RunReport | None = None,
        observations: tuple[AttemptObservation, ...] = (),
        patches: dict[str, bool] | None = None,
    ) -> None:
        self.run_id = writer.run_id
        self.attempt = attempt
        self.resumed = resumed
        self.state = state
        self.store = store
        self._writer = writer
        self._cursors = cursors
        self._version = version
        self._input = input_value
        self._in_doubt = in_doubt
        self._scopes = [Scope("", {})]
        self._steps = 0
        self._report = report if report is not None else RunReport()
        self._observations = observations
        self._tags: RunTags | None = None
        self._step_error: tuple[str, BaseException] | None = None
        self._patches = patches or {}  # decided by the replay check a resume ran first
        self._in_flight: set[asyncio.Future[Any]] = set()  # astep calls not ended yet

    def __repr__(self) -> str:
        return f"RunContext(run_id={self.run_id!r}, attempt={self.attempt}, steps={self._steps})"

    @property
    def effects(self) -> Journal:
        """The run's effect journal (for custom replay logic)."""
        return self._writer.effects

    @property
    def writer(self) -> DurableWriter:
        """The run's writer (durability mode, flush)."""
        return self._writer

    @property
    def steps(self) -> int:
        """How many ``step`` calls this attempt made so far (replayed ones included)."""
        return self._steps

    @property
    def tags(self) -> RunTags:
        """The run's tags (``{str: str}``); setting one rewrites ``run.meta`` at once."""
        if self._tags is None:
            self._tags = RunTags(self._writer)
        return self._tags

    @property
    def scheduled_slot(self) -> dt.datetime | None:
        """The slot (UTC) a schedule started this run for; None for a run no schedule made.

        Read from the run's ``schedule.slot`` tag, which the watcher sets when it creates
        the run, so a run started late (machine off, catch-up) still knows which slot it
        is for.
        """
        slot = tags_of(self._writer.run.meta.extra).get(SLOT_TAG_KEY)
        if slot is None:
            return None
        try:
            return dt.datetime.fromisoformat(slot)
        except ValueError:
            return None

    # -- steps --------------------------------------------------------------------

    # -- checkpoints and loops ------------------------------------------------------

    def checkpoint(self) -> None:
        """Persist ``ctx.state`` (and the loop positions) now, per the durability mode.

        The checkpoint also carries the run's progress and the metric points
        recorded since the previous one.
        """
        report = self._report
        payload = {
            "state": self.state,
            "cursors": self._cursors,
            "version": self._version,
            PROGRESS_KEY: report.progress_payload(),
        }
        metrics = report.take_metrics()
        try:
            self._writer.checkpoint(_RUNTIME_STATE, payload, step=report.steps, metrics=metrics)
        except UnstorableValueError:
            report.put_back(metrics)  # nothing was written: they go with the next one
            raise  # it names the value's path (state.model.weights) and type
        except (TypeError, msgspec.EncodeError) as exc:
            report.put_back(metrics)
            raise TypeError(
                f"run {self.run_id!r}: ctx.state must hold msgpack-able data (dict, list, str, "
                f"int, float, bool, None, bytes, datetime, msgspec Structs): {exc}"
            ) from exc

    # -- code changes -----------------------------------------------------------------

    def patched(self, patch_id: str) -> bool:
        """True where the code may take its new branch ``patch_id``; False where a run's
        journal already went past this point without it.

        Put a change to a job with runs in flight behind it, so that those runs keep
        doing what they recorded and new ones (and each run from the point it reaches
        live) take the new path::

            for item in items:
                if ctx.patched("fee"):
                    ctx.step("fee", charge_fee, item)
                ctx.step("charge", charge, item)

        The decision is journaled where it is made, so it never flips on a later
        resume. Once no run needs the old branch any more, replace the call by
        :meth:`deprecate_patch` (``afk-local replay --all`` lists the runs that still
        take an old branch), and later remove both.
        """
        key = self._key(PATCH_PREFIX + _patch_id(patch_id))
        journal = self._writer.effects
        known = journal.lookup(key)
        if known is not None and known.status == "ok" and known.outcome is not None:
            return known.outcome.result is True
        if isinstance(journal, ReplayJournal):
            decision = not journal.passed()
            journal.patch_decisions[key] = decision
            return decision
        decision = self._patches.get(key, True)
        journal.record_outcome(key, status="ok", result=decision)
        return decision

    def deprecate_patch(self, patch_id: str) -> None:
        """Say that the old branch of ``patch_id`` is gone: the code takes the new one only.

        A run whose journal recorded the old branch here cannot go on under this code:
        it raises :class:`~afk_local.ReplayDivergence` (``afk-local replay`` finds such
        runs first).
        """
        key = self._key(PATCH_PREFIX + _patch_id(patch_id))
        known = self._writer.effects.lookup(key)
        if known is not None and known.outcome is not None and known.outcome.result is False:
            raise ReplayDivergence(
                self.run_id,
                self._steps + 1,
                key,
                f"the old branch of patch {patch_id!r}",
                f"the new branch only (ctx.deprecate_patch({patch_id!r}))",
                kind="patch",
            )

    # -- human in the loop ----------------------------------------------------------

    def pause(self, prompt: Any = None, *, kind: str = "input") -> Any:
        """Wait for a person: the run becomes ``paused``; :class:`~afk_local.RunPaused` propagates.

        ``afk.resume(run_id, input=value)`` re-runs the job; this call then
        returns ``value`` (journaled, so later resumes return it too). The
        prompt and the input must be msgpack-able.
        """
        key = self._key(_PAUSE)
        journal = self._writer.effects
        answered = journal.lookup(key)
        if answered is not None and answered.status == "ok" and answered.outcome is not None:
            journal.replayed_count += 1
            return answered.outcome.result
        if self._input is not NO_INPUT:
            value, self._input = self._input, NO_INPUT
            return journal.call(
                key, lambda: value, name=_PAUSE, step=self._report.steps, idempotent=True
            )
        self.checkpoint()
        self._writer.pause(kind, prompt, key=key, step=self._report.steps, **self._report.extras())
        raise RunPaused(self.run_id, kind, prompt)


def _patch_id(patch_id: str) -> str:
    if not isinstance(patch_id, str) or not patch_id or "/" in patch_id or "#" in patch_id:
        raise ValueError(f"a patch id is a non-empty string without '/' or '#', not {patch_id!r}")
    return patch_id


__all__ = ["NO_INPUT", "PAUSE_NAME", "RunContext", "set_step_hook"]
