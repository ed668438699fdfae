"""The bookkeeping around one attempt of a durable run: its report, observers and extras.

:func:`start_report` continues the run's logical step count (from the journal)
and progress (from the snapshot the attempt resumes from); :func:`observe_attempt`
tells the registered observers (:mod:`.observe`) that an attempt starts and
:func:`attempt_ended` that it ended; :func:`attempt_extra` is what the attempt
records in ``run.meta`` ``extra``; :func:`terminal_extras` what its ``paused`` or
``run_terminal`` checkpoint carries besides its outcome.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from afk_local.journal.journal import journal_of
from afk_local.runner.code.origin import ORIGIN_KEY, UNRESUMABLE_KEY
from afk_local.runner.observe.observe import AttemptInfo, AttemptObservation, observers
from afk_local.runner.observe.run_report import RunReport, journal_step_count
from afk_local.runner.run.run_context import RunContext
from afk_local.storage.rundir.write.writer import RunWriter
from afk_local.storage.views.run_info import TAGS_KEY, tags_of

log = logging.getLogger("afk_local")


def start_report(run: RunWriter, snapshot: Any, *, resumed: bool) -> RunReport:
    """The attempt's :class:`RunReport`: the step count an earlier attempt left, its progress.

    A resumed run's count is the number of distinct step keys in its journal (which
    opens it, as the first ``ctx.step`` would), so steps that ran after the last
    checkpoint count too, once.
    """
    steps = 0
    if resumed and run.paths.journal.exists():
        steps = journal_step_count(journal_of(run).keys())
    return RunReport(steps, snapshot)


def observe_attempt(
    run: RunWriter, entrypoint: str | None, *, resumed: bool
) -> tuple[AttemptObservation, ...]:
    """Tell the registered observers that an attempt starts (one that raises is left out)."""
    found = observers()
    if not found:
        return ()
    meta = run.meta
    info = AttemptInfo(
        run.run_id, meta.attempt, entrypoint, resumed, run.seq, dict(meta.extra or {})
    )
    started = []
    for observer in found:
        try:
            started.append(observer.attempt_started(info))
        except Exception:
            log.exception("run %s: observer %r failed; it sees nothing of it", run.run_id, observer)
    return tuple(started)


def attempt_extra(
    extra: Mapping[str, Any],
    origin: Any,
    tags: Mapping[str, str] | None,
    observations: tuple[AttemptObservation, ...],
) -> dict[str, Any]:
    """The ``run.meta`` ``extra`` of an attempt: where it runs, new tags, observers' entries.

    A reason recorded by an earlier resume that found the code gone is dropped: this
    attempt found it.
    """
    result = {k: v for k, v in extra.items() if k != UNRESUMABLE_KEY}
    result[ORIGIN_KEY] = origin
    if tags:
        result[TAGS_KEY] = {**tags_of(extra), **tags}
    for observation in observations:
        result.update(observation.meta_extra())
    return result


def terminal_extras(ctx: RunContext, error: BaseException | None = None) -> dict[str, Any]:
    """``progress``, pending ``metrics``, for a failure the ``failed_step`` key (or None), and
    the ``step`` (the logical count) the terminal checkpoint records."""
    extras = {"step": ctx.report.steps, **ctx.report.extras()}
    if error is not None:
        extras["failed_step"] = ctx.failed_step(error)
    return extras


def attempt_ended(
    run_id: str,
    observations: tuple[AttemptObservation, ...],
    status: str,
    error: BaseException | None,
) -> None:
    """Tell the attempt's observers how it ended (their errors are logged, never raised)."""
    for observation in observations:
        try:
            observation.ended(status, error)
        except Exception:
            log.exception("run %s: observer failed at the end of the attempt", run_id)


__all__ = [
    "attempt_ended",
    "attempt_extra",
    "observe_attempt",
    "start_report",
    "terminal_extras",
]
