"""RunInfo: one row of a store's listing, what a person wants to see about a run.

:class:`RunList` is what :meth:`~afk_local.Store.runs` returns: a list of them that a
notebook draws as a table (status colours, progress bars) and that converts to
records or a pandas DataFrame.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from afk_local.storage.format.records import RunStatus
from afk_local.storage.rundir.ownership import OwnerProbe, is_interrupted
from afk_local.storage.views.notebook import (
    RunRow,
    format_bytes,
    format_ms,
    runs_table_html,
)
from afk_local.storage.views.run_progress import (
    RunProgress,
    format_duration,
    format_progress,
    journaled_step,
)

TAGS_KEY = "tags"
"""``RunMeta.extra`` key of a run's tags (``{str: str}``)."""


def tags_of(extra: Any) -> dict[str, str]:
    """The tags recorded in a run's ``extra`` (string keys and values only)."""
    raw = extra.get(TAGS_KEY) if isinstance(extra, Mapping) else None
    if not isinstance(raw, Mapping):
        return {}
    return {k: v for k, v in raw.items() if isinstance(k, str) and isinstance(v, str)}


@dataclass(frozen=True)
class RunInfo:
    """One line of :meth:`Store.runs`: what a person wants to see about a run."""

    run_id: str
    status: RunStatus
    step: int
    phase: str | None
    seq: int
    updated_ms: int
    owner_alive: bool
    bytes: int
    thread_id: str | None = None
    parent_run_id: str | None = None
    entrypoint: str | None = None
    attempt: int = 0
    created_ms: int = 0
    tags: dict[str, str] = field(default_factory=dict, hash=False)
    progress: RunProgress | None = None
    """From the newest checkpoint (None when it records none: other writers, older runs)."""
    lock_problem: str | None = None
    """Set when ``owner.lock`` is damaged (a symlink, a FIFO...): nobody can own the run
    until a person removes it; ``afk-local verify`` lists it."""
    damage: str | None = None
    """Set when the run's newest checkpoint cannot be read (a damaged file or pack): why,
    in one line; ``afk-local verify RUN`` lists every damaged file."""
    wake_at_ms: int = 0
    """For ``sleeping`` runs: when the watcher resumes it (wall clock, ms)."""
    idle: bool = False
    """A paused thread kept by the code that uses it (a LangGraph thread, a ``RunSession``
    conversation): idle until that code writes again; nothing waits for anyone."""

    @property
    def interrupted(self) -> bool:
        """Running (or created) with nobody holding its lock: a crash left it behind,
        or, for a run :attr:`not_started`, it waits for its first start (the watcher
        starts both)."""
        return is_interrupted(self.status, OwnerProbe(self.owner_alive, self.lock_problem))

    @property
    def not_started(self) -> bool:
        """Made for another process to start (a schedule's slot, a submitted or restarted
        run; attempt 0) and not started yet: nothing was interrupted."""
        return self.interrupted and self.status is RunStatus.CREATED and self.attempt == 0

    @property
    def live(self) -> bool:
        """A process holds the run's lock now."""
        return self.owner_alive

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the current attempt's rate; only while a process runs it."""
        if not self.owner_alive or self.progress is None:
            return None
        return self.progress.eta_s

    def to_record(self) -> dict[str, Any]:
        """The run as one flat dict (``afk-local runs --json`` prints these)."""
        p = self.progress
        return {
            "run_id": self.run_id,
            "status": self.status.value,
            "interrupted": self.interrupted,
            "owner_alive": self.owner_alive,
            "lock_problem": self.lock_problem,
            "step": self.step,
            "seq": self.seq,
            "phase": self.phase,
            "updated_ms": self.updated_ms,
            "created_ms": self.created_ms,
            "bytes": self.bytes,
            "thread_id": self.thread_id,
            "parent_run_id": self.parent_run_id,
            "entrypoint": self.entrypoint,
            "attempt": self.attempt,
            "tags": dict(self.tags),
            "done": p.done if p else None,
            "total": p.total if p else None,
            "fraction": p.fraction if p else None,
            "active_ms": p.active_ms if p else None,
            "eta_s": self.eta_s,
            "damage": self.damage,
            "wake_at_ms": self.wake_at_ms or None,
            "not_started": self.not_started,
            "idle": self.idle,
        }

    def _row(self) -> RunRow:
        p = self.progress
        return RunRow(
            run_id=self.run_id,
            status=self.status.value,
            label=_label(self),
            fraction=p.fraction if p else None,
            progress=format_progress(p),
            step=journaled_step(self.step, p),
            attempt=self.attempt,
            elapsed=format_duration(p.active_ms / 1000) if p else "-",
            eta=format_duration(self.eta_s) if self.eta_s is not None else "-",
            updated=format_ms(self.updated_ms),
            size=format_bytes(self.bytes),
            tags=" ".join(f"{k}={v}" for k, v in self.tags.items()),
        )

    def __repr__(self) -> str:
        alive = ", owner alive" if self.owner_alive else ""
        if self.lock_problem is not None:
            alive = f", {self.lock_problem}"
        if self.damage is not None:
            alive += f", damaged: {self.damage}"
        return (
            f"RunInfo(run_id={self.run_id!r}, status={self.status.value}, step={self.step}, "
            f"seq={self.seq}, phase={self.phase}, updated={format_ms(self.updated_ms)}, "
            f"bytes={self.bytes}{alive})"
        )

    def _repr_html_(self) -> str:
        """Notebook view: one table row."""
        return runs_table_html([self._row()])


def _label(info: RunInfo) -> str:
    if info.not_started:
        return "created (not started)"
    if info.idle:
        return "paused (idle thread)"
    if info.interrupted:
        return f"{info.status.value} (interrupted)"
    if info.owner_alive:
        return f"{info.status.value} (live)"
    if info.wake_at_ms and info.status.value == RunStatus.SLEEPING.value:
        return f"sleeping (until {format_ms(info.wake_at_ms)})"
    return info.status.value


class RunList(list[RunInfo]):
    """The runs :meth:`~afk_local.Store.runs` found: a list, drawn as a table in a notebook."""

    def to_records(self) -> list[dict[str, Any]]:
        """One flat dict per run (:meth:`RunInfo.to_record`)."""
        return [info.to_record() for info in self]

    def to_pandas(self) -> Any:
        """A ``pandas.DataFrame`` of :meth:`to_records` (ImportError without pandas)."""
        try:
            import pandas  # type: ignore[import-untyped,unused-ignore]  # noqa: PLC0415
        except ImportError:
            raise ImportError(
                "to_pandas() needs pandas (pip install pandas); to_records() gives plain dicts"
            ) from None
        return pandas.DataFrame(self.to_records())

    def _repr_html_(self) -> str:
        """Notebook view: one row per run, status in colour, progress as a bar."""
        return runs_table_html([info._row() for info in self])


__all__ = ["TAGS_KEY", "RunInfo", "RunList", "tags_of"]
