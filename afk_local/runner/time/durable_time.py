"""Durable time on :class:`~afk_local.RunContext`: ``ctx.sleep``, ``ctx.sleep_until``, limits.

A base class of the run context, as :class:`~afk_local.runner.observe.run_report.Reporting`
is: the sleeps (:mod:`.sleeps`), the backoff of retried steps (:mod:`.retry`) and
the wait for a place under a shared :class:`~afk_local.Limit` (:mod:`.limits`),
each made visible in ``run.meta`` (``sleeping`` with ``wake_at_ms``; the
``waiting`` extra).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from collections.abc import Callable, Iterator
from typing import Any

from afk_local.clock import current_clock
from afk_local.errors import RunSleeping
from afk_local.journal.journal import Journal
from afk_local.runner.observe.run_report import RunReport
from afk_local.runner.time.limits import Limit, limited
from afk_local.runner.time.sleeps import DEFAULT_PARK_AFTER_S, as_epoch_s, journaled_due, wait_until
from afk_local.runner.writer import DurableWriter
from afk_local.storage.format.records import WAITING_KEY, RunStatus
from afk_local.storage.store import Store

_SLEEP = "@sleep"
_CTX: Any = object()  # park_after not given: the context's


class DurableTime:
    """The part of :class:`~afk_local.RunContext` that waits (a base class)."""

    run_id: str
    store: Store
    _writer: DurableWriter
    _report: RunReport
    park_after: float | None = DEFAULT_PARK_AFTER_S
    """Waits longer than this many seconds park the run; None never parks."""

    def _key(self, name: str) -> str:
        raise NotImplementedError

    def checkpoint(self) -> None:
        """Persist the run's state now (the run context's)."""
        raise NotImplementedError

    def sleep(self, seconds: float, *, park_after: float | object | None = _CTX) -> None:
        """Wait ``seconds`` durably: the due time is journaled once, a resume waits the rest.

        A wait longer than ``park_after`` seconds (default :attr:`park_after`, a
        minute) parks the run: it checkpoints, its status becomes ``sleeping`` with
        ``wake_at``, and :class:`~afk_local.RunSleeping` ends this process's attempt;
        ``afk-local watch`` resumes it when due (the job re-runs from the top, its
        finished steps replayed, and this call returns). Wall clock: time the machine
        spent asleep or off counts as waited.

        >>> ctx.sleep(600)  # doctest: +SKIP
        """
        if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
            raise TypeError(f"ctx.sleep takes seconds (a number), not {seconds!r}")
        clock = current_clock()
        self._sleep(self._key(_SLEEP), lambda: clock.time() + max(seconds, 0), park_after)

    def sleep_until(
        self, when: float | datetime.datetime, *, park_after: float | object | None = _CTX
    ) -> None:
        """Wait durably until ``when`` (a datetime, naive = local time, or epoch seconds).

        The first attempt journals ``when``; later attempts keep that due time even
        if they compute another ``when``. Parks like :meth:`sleep`.
        """
        target = as_epoch_s(when)
        self._sleep(self._key(_SLEEP), lambda: target, park_after)

    async def asleep(self, seconds: float, *, park_after: float | object | None = _CTX) -> None:
        """The async twin of :meth:`sleep`: the wait runs in a worker thread, not the loop."""
        await asyncio.to_thread(self.sleep, seconds, park_after=park_after)

    async def asleep_until(
        self, when: float | datetime.datetime, *, park_after: float | object | None = _CTX
    ) -> None:
        """The async twin of :meth:`sleep_until`."""
        await asyncio.to_thread(self.sleep_until, when, park_after=park_after)

    def _sleep(self, key: str, due: Callable[[], float], park_after: float | object | None) -> None:
        journal = self._writer.effects
        due_ms = journaled_due(journal, key, due, step=self._report.steps)
        if journal.replaying and due_ms > current_clock().time() * 1000:
            raise journal.frontier_at(key, "the run sleeps here")  # type: ignore[attr-defined]
        after = self.park_after if park_after is _CTX else park_after
        if after is not None and not isinstance(after, (int, float)):
            raise TypeError(f"park_after must be seconds or None, not {after!r}")
        wait_until(due_ms, park_after=after, park=self._park)

    def _backoff(self, key: str, seconds: float) -> None:
        """The durable wait between two tries of a retried step."""
        clock = current_clock()
        self._sleep(key, lambda: clock.time() + seconds, _CTX)

    def _park(self, due_ms: int) -> None:
        """Checkpoint, mark the run ``sleeping`` until ``due_ms`` and end the attempt."""
        self.checkpoint()
        self._writer.flush()
        self._writer.update_meta(
            status=RunStatus.SLEEPING, wake_at_ms=due_ms, next_attempt_ms=0, watcher_attempts=0
        )
        raise RunSleeping(self.run_id, due_ms)

    @contextlib.contextmanager
    def _limited(self, journal: Journal, key: str, limit: Limit | None) -> Iterator[None]:
        """A place under ``limit`` for the step ``key``; nothing for a replayed or unlimited one.

        When the step got its place is journaled (an outcome under ``<key>@limit``
        holding the limit's name and ``started_ms``), so a run's journal tells when
        each of its limited calls started, as the limit counted it.
        """
        known = journal.lookup(key) if limit is not None else None
        if limit is None or journal.replaying or (known is not None and known.status == "ok"):
            yield
            return

        def waiting(what: str | None) -> None:
            extra = dict(self._writer.run.meta.extra)
            if what is None:
                extra.pop(WAITING_KEY, None)
            else:
                since = int(current_clock().time() * 1000)
                extra[WAITING_KEY] = {
                    "limit": limit.name,
                    "for": what,
                    "step": key,
                    "since_ms": since,
                }
            self._writer.update_meta(extra=extra)

        with limited(self.store.root, limit, waiting) as started:
            started_ms = int(started * 1000)
            result = {"limit": limit.name, "started_ms": started_ms}
            journal.record_outcome(f"{key}@limit", status="ok", result=result)
            yield


__all__ = ["WAITING_KEY", "DurableTime"]
