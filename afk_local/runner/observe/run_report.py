"""What a durable run says about itself in every checkpoint: steps, progress, time, metrics.

:class:`RunReport` belongs to one attempt's :class:`~afk_local.RunContext`. It keeps

- the **logical step count**: distinct ``ctx.step`` keys of the whole run, each
  counted once however often it was replayed or retried, so it continues across
  attempts (the journal knows every key an earlier attempt started);
- **progress** ``done/total``: the outermost running ``ctx.iterate`` loop, or what
  ``ctx.progress`` declared;
- **active time**: the time of every attempt up to its last checkpoint, plus this one's;
- **metric points** from ``ctx.metric``, handed to the next checkpoint and no sooner
  written.

Its :meth:`RunReport.progress_payload` is the ``progress`` map of docs/format.md
("Progress and metrics"), read back by :mod:`afk_local.storage.views.run_progress`.
"""

from __future__ import annotations

import time
from typing import Any

from afk_local.storage.rundir.read.metrics import Batch, merge_batches
from afk_local.storage.views.run_progress import PROGRESS_KEY, progress_of


class RunReport:
    """Steps, progress, active time and pending metrics of one attempt (see the module doc).

    Args:
        steps: the run's logical step count when this attempt starts.
        snapshot: the payload this attempt resumes from (its ``progress`` map is
            continued), or None for a new run.
    """

    def __init__(self, steps: int = 0, snapshot: Any = None) -> None:
        before = progress_of(snapshot)
        self.steps = steps
        self.done: int | None = before.done if before else None
        self.total: int | None = before.total if before else None
        self.unit: str | None = before.unit if before else None
        self.explicit = before is not None and before.unit == "steps"
        """``ctx.progress`` declared the total: loops no longer set it."""
        self._active_before = before.active_ms if before else 0
        self._started = time.monotonic()
        self._since = self._started
        self._since_done = self.done or 0
        self.metrics: Batch = {}
        """Metric points not yet in a checkpoint, by name (grouped as recorded: cheap to take)."""
        self.item_index: int | None = None
        """The logical index of the ``ctx.iterate`` item being worked on (innermost loop), or
        None outside loops: the default x position of a metric point recorded there."""

    # -- steps ------------------------------------------------------------------------

    def step_started(self, known: bool) -> int:
        """Count a ``ctx.step`` call; returns the step number its intent records.

        ``known``: the journal already holds its key (a replay or a retry), so it is
        not counted again. A retried call is numbered after the current count, so a
        checkpoint of the same millisecond never claims it (fork's ordering rule).
        """
        if known:
            return self.steps + 1
        self.steps += 1
        if self.explicit and self.unit == "steps":
            self.done = self.steps
        return self.steps

    # -- progress ---------------------------------------------------------------------

    def declare(self, total: int | None, done: int | None) -> None:
        """``ctx.progress(total=N, done=n)``: the run's own measure of progress."""
        if self.done != done or not self.explicit:
            self._restart_rate(done if done is not None else self.steps)
        self.explicit = True
        self.unit = "steps"
        self.total = total
        self.done = done if done is not None else self.steps

    def loop_opened(self, total: int | None, done: int) -> None:
        """An outermost ``ctx.iterate`` loop starts (``done`` items skipped as finished)."""
        if self.explicit:
            return
        self.unit, self.total, self.done = "items", total, done
        self._restart_rate(done)

    def item_done(self, done: int) -> None:
        """An item of the outermost loop finished; ``done`` items are done in all."""
        if not self.explicit:
            self.done = done

    def _restart_rate(self, done: int) -> None:
        self._since = time.monotonic()
        self._since_done = done

    def progress_payload(self) -> dict[str, Any]:
        """The ``progress`` map a checkpoint carries (docs/format.md)."""
        now = time.monotonic()
        return {
            "steps": self.steps,
            "done": self.done,
            "total": self.total,
            "unit": self.unit,
            "active_ms": self._active_before + int((now - self._started) * 1000),
            "since_ms": int((now - self._since) * 1000),
            "since_done": self._since_done,
        }

    def extras(self) -> dict[str, Any]:
        """``progress`` and pending ``metrics`` for a pause or terminal payload (metrics taken)."""
        extra: dict[str, Any] = {PROGRESS_KEY: self.progress_payload()}
        batch = self.take_metrics()
        if batch:
            extra["metrics"] = batch
        return extra

    # -- metrics ----------------------------------------------------------------------

    def take_metrics(self) -> Batch | None:
        """The pending metric points as one batch (``{name: [(step, value), ...]}``)."""
        batch = self.metrics
        if not batch:
            return None
        self.metrics = {}
        return batch

    def put_back(self, batch: Batch | None) -> None:
        """Return points a failed checkpoint did not store, ahead of newer ones."""
        self.metrics = merge_batches(batch, self.metrics) or {}


class Reporting:
    """The part of :class:`~afk_local.RunContext` a job reports through (a base class).

    ``ctx.metric``, ``ctx.progress``, ``ctx.step_count`` and ``ctx.report``.
    """

    _report: RunReport

    @property
    def step_count(self) -> int:
        """The run's logical step count: distinct ``step`` calls of every attempt so far.

        Each key counts once, however often it was replayed or retried, so the count
        continues where the previous attempt left it. Checkpoints record it as ``step``.
        """
        return self._report.steps

    @property
    def report(self) -> RunReport:
        """Steps, progress, active time and pending metrics of this attempt."""
        return self._report

    def metric(self, name: str, value: float, *, step: int | None = None) -> None:
        """Record a scalar (``loss``, ``reward``...) at the current item, else the current step.

        Cheap: the point waits in memory and is written with the next checkpoint
        (``iterate`` item, ``ctx.checkpoint()``, pause or end), never on its own. A
        crash loses the points recorded since the last checkpoint, as it loses the
        work they measured (which runs again). Read them with ``afk-local metrics RUN``
        or ``store.open(run_id).metrics()``.

        Args:
            name: the metric's name.
            value: a number (anything ``float()`` takes: numpy and torch scalars too).
            step: the x position (default: inside ``ctx.iterate``, the item's logical
                index, the position in ``items`` counted from 0, the same on every
                attempt; elsewhere :attr:`step_count`).
        """
        number = float(value)
        report = self._report
        rows = report.metrics.get(name)
        if rows is None:
            if type(name) is not str or not name:
                raise ValueError(f"a metric name is a non-empty string, not {name!r}")
            rows = report.metrics[name] = []
        if step is None:
            step = report.steps if report.item_index is None else report.item_index
        rows.append((int(step), number))

    def progress(self, total: int | None = None, *, done: int | None = None) -> None:
        """Declare the run's progress: ``total`` units of work, ``done`` of them done.

        Without ``done``, the logical step count (:attr:`step_count`) is the count
        done. Once called, ``iterate`` loops no longer set the run's progress.
        ``afk-local runs`` and ``show`` display it (n/N, %, ETA) from the next checkpoint.
        """
        if total is not None and (not isinstance(total, int) or total < 0):
            raise ValueError(f"total is a whole number >= 0 or None, not {total!r}")
        if done is not None and (not isinstance(done, int) or done < 0):
            raise ValueError(f"done is a whole number >= 0 or None, not {done!r}")
        self._report.declare(total, done)


def journal_step_count(keys: list[str]) -> int:
    """The logical step count an earlier attempt left: distinct step keys in the journal.

    Keys whose last part starts with ``@`` are not steps (``@pause#1``: pause answers).
    """
    return sum(1 for key in keys if not key.rpartition("/")[2].startswith("@"))


__all__ = ["Reporting", "RunReport", "journal_step_count"]
