"""RunInfo: one row of a store's listing, what a person wants to see about a run."""

from __future__ import annotations

from dataclasses import dataclass

from afk_local.storage.notebook import format_bytes, format_ms, html_table
from afk_local.storage.records import RunStatus


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
    lock_problem: str | None = None
    """Set when ``owner.lock`` is damaged (a symlink, a FIFO...): nobody can own the run
    until a person removes it; ``afk-local verify`` lists it."""

    @property
    def interrupted(self) -> bool:
        """Running (or created) with nobody holding its lock: a crash left it behind."""
        return (
            self.status in (RunStatus.RUNNING, RunStatus.CREATED)
            and not self.owner_alive
            and self.lock_problem is None
        )

    def __repr__(self) -> str:
        alive = ", owner alive" if self.owner_alive else ""
        if self.lock_problem is not None:
            alive = f", {self.lock_problem}"
        return (
            f"RunInfo(run_id={self.run_id!r}, status={self.status.value}, step={self.step}, "
            f"seq={self.seq}, phase={self.phase}, updated={format_ms(self.updated_ms)}, "
            f"bytes={self.bytes}{alive})"
        )

    def _repr_html_(self) -> str:
        """Notebook view: one table row."""
        return html_table(
            ("run", "status", "step", "seq", "phase", "updated", "size", "owner alive"),
            [
                (
                    self.run_id,
                    self.status.value,
                    self.step,
                    self.seq,
                    self.phase or "-",
                    format_ms(self.updated_ms),
                    format_bytes(self.bytes),
                    "yes" if self.owner_alive else "no",
                )
            ],
        )


__all__ = ["RunInfo"]
