"""What a watcher reports: one :class:`WatchEvent` per thing it did."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from afk_local.storage.format.records import now_ms


@dataclass(frozen=True)
class WatchEvent:
    """One thing the watcher did: printed as a line, or as JSON with ``--json``.

    ``kind`` is one of ``started``, ``resumed``, ``completed``, ``paused``,
    ``failed``, ``sleeping`` (parked in a long ``ctx.sleep``), ``scheduled`` (a schedule's
    slot got its run), ``backoff``, ``gave_up``,
    ``stopped``, ``taken`` (another
    process holds the run), ``skipped`` (an interrupted run no process can resume, or
    whose ``run.meta`` cannot be read, e.g. a newer schema version; said once),
    ``damaged`` (its ``owner.lock`` is not a lock: left for a person), ``refused``
    (the trust gate refused the run: nothing was started; said once per change of
    the run), ``submitted``, ``request``, ``rejected``, ``stopping``.
    """

    kind: str
    run_id: str | None = None
    message: str = ""
    attempt: int = 0
    delay_s: float | None = None
    exit_code: int | None = None
    log: str | None = None
    ts_ms: int = field(default_factory=now_ms)

    def to_dict(self) -> dict[str, Any]:
        """The event as a JSON-able dict (None fields left out)."""
        out = {
            "event": self.kind,
            "run_id": self.run_id,
            "message": self.message,
            "attempt": self.attempt,
            "delay_s": self.delay_s,
            "exit_code": self.exit_code,
            "log": self.log,
            "ts_ms": self.ts_ms,
        }
        return {k: v for k, v in out.items() if v is not None}


__all__ = ["WatchEvent"]
