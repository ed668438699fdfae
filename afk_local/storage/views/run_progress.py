"""How far a run got: the ``progress`` a durable job writes into its checkpoints.

``@afk.durable`` jobs put a ``progress`` map into every ``run_started``,
``runtime_state``, ``paused`` and ``run_terminal`` payload (docs/format.md,
"Progress and metrics"). :func:`progress_of` reads it back from a payload;
checkpoints written before it existed (and other writers' checkpoints) have none,
and the listing shows ``-`` for them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PROGRESS_KEY = "progress"
"""The payload key holding a checkpoint's progress map."""


@dataclass(frozen=True)
class RunProgress:
    """Where a run stood at one checkpoint.

    Attributes:
        steps: the logical step count: distinct ``ctx.step`` calls of the whole run,
            each counted once however often it was replayed or retried.
        done: units done (``ctx.iterate`` items, or what ``ctx.progress`` says).
        total: units in all (None when unknown).
        unit: ``"items"`` (an ``iterate`` loop) or ``"steps"`` (``ctx.progress``).
        active_ms: time spent running, summed over every attempt up to this checkpoint
            (the time between a crash and the last checkpoint before it is not counted).
        since_ms: how long this attempt (or its current loop) had run at this checkpoint.
        since_done: ``done`` when that period started; the rate is measured from there.
    """

    steps: int = 0
    done: int | None = None
    total: int | None = None
    unit: str | None = None
    active_ms: int = 0
    since_ms: int = 0
    since_done: int = 0

    @property
    def fraction(self) -> float | None:
        """``done / total`` in 0..1, or None when either is unknown."""
        if self.done is None or not self.total:
            return None
        return max(0.0, min(1.0, self.done / self.total))

    @property
    def rate(self) -> float | None:
        """Units per second over the current attempt (None before it has done one)."""
        if self.done is None or self.since_ms <= 0:
            return None
        gained = self.done - self.since_done
        return gained * 1000.0 / self.since_ms if gained > 0 else None

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the current attempt's rate, from this checkpoint (None if unknown)."""
        rate = self.rate
        if rate is None or self.total is None or self.done is None:
            return None
        return max(0, self.total - self.done) / rate

    def to_dict(self) -> dict[str, Any]:
        """The progress map as it is stored (and printed by ``--json``)."""
        return {
            "steps": self.steps,
            "done": self.done,
            "total": self.total,
            "unit": self.unit,
            "active_ms": self.active_ms,
            "since_ms": self.since_ms,
            "since_done": self.since_done,
        }


def progress_of(payload: Any) -> RunProgress | None:
    """The :class:`RunProgress` in a checkpoint payload, or None when it has none.

    Tolerant: a field of the wrong type is ignored, never raised (the listing must
    show every run, whatever wrote it).
    """
    if not isinstance(payload, dict):
        return None
    raw = payload.get(PROGRESS_KEY)
    if not isinstance(raw, dict):
        return None

    def whole(name: str, default: int | None) -> int | None:
        value = raw.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) else default

    unit = raw.get("unit")
    return RunProgress(
        steps=whole("steps", 0) or 0,
        done=whole("done", None),
        total=whole("total", None),
        unit=unit if isinstance(unit, str) else None,
        active_ms=whole("active_ms", 0) or 0,
        since_ms=whole("since_ms", 0) or 0,
        since_done=whole("since_done", 0) or 0,
    )


def format_duration(seconds: float | None) -> str:
    """``3725`` -> ``1h02m``; ``42`` -> ``42s``; None -> ``-``."""
    if seconds is None:
        return "-"
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def format_progress(progress: RunProgress | None) -> str:
    """``120/300 40%``, ``120`` (no total), ``7 steps`` (no count at all) or ``-``."""
    if progress is None:
        return "-"
    if progress.done is None:
        return f"{progress.steps} steps" if progress.steps else "-"
    if progress.total is None:
        return str(progress.done)
    fraction = progress.fraction
    percent = f" {fraction * 100:.0f}%" if fraction is not None else ""
    return f"{progress.done}/{progress.total}{percent}"


def journaled_step(step: int, progress: RunProgress | None) -> int | None:
    """A checkpoint's ``step`` when it is worth showing as one, else None.

    A durable job's checkpoint (it carries a ``progress`` map) counts journaled
    ``ctx.step`` calls: 0 means none was made (an ``iterate`` loop may make none), so
    there is no step to show. Another writer's checkpoint keeps the step it gave.
    """
    return step if progress is None or step > 0 else None


def format_position(step: int, progress: RunProgress | None) -> str:
    """Where a run stood at one checkpoint, in words, from what the checkpoint records.

    ``12 of 40 items done`` (an ``iterate`` loop's items), ``12 of 40 done`` (what
    ``ctx.progress`` declared), then ``step N`` where ``N`` counts journaled ``ctx.step``
    calls: ``12 of 40 items done, step 3``. A durable job's checkpoint (it carries a
    ``progress`` map) says ``step 0`` nowhere: a loop that journals no call has no step
    to show, and before the first call there is none either. A checkpoint without the
    map (another writer's) keeps the step its writer gave. ``""`` when nothing is known.
    """
    parts = []
    if progress is not None and progress.done is not None:
        noun = " items" if progress.unit == "items" else ""
        of = f" of {progress.total}" if progress.total is not None else ""
        parts.append(f"{progress.done}{of}{noun} done")
    if journaled_step(step, progress) is not None:
        parts.append(f"step {step}")
    return ", ".join(parts)


__all__ = [
    "PROGRESS_KEY",
    "RunProgress",
    "format_duration",
    "format_position",
    "format_progress",
    "journaled_step",
    "progress_of",
]
