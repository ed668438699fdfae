"""Running a job's current code against a run's journal: the replay check.

:func:`replay_job` calls the job function once more, from the top, with a fresh
``ctx.state``, against a :class:`~afk_local.journal.replaying.ReplayJournal`: every
call the run journaled is served from the journal, no step function is called and
nothing is written to the run (checkpoints, pauses, parks and meta updates go to
a :class:`ReplayWriter` that drops them). It ends where the code first departs from
the journal (a :class:`~afk_local.errors.ReplayDivergence`), where a resume would
go live (the frontier), or when the job returns, whose result a finished run must
reproduce. ``afk-local replay`` and :func:`afk_local.testing.replay` report it;
every resume runs it first (:func:`check_before_resume`) and refuses on a divergence.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from afk_local.errors import AgentRequestMismatchError, ReplayDivergence
from afk_local.journal.journal import Journal
from afk_local.journal.replay import result_hash
from afk_local.journal.replaying import (
    ReplayFrontier,
    ReplayJournal,
    is_patch_key,
    patch_id_of,
)
from afk_local.runner.run.current import running
from afk_local.runner.run.run_context import RunContext
from afk_local.runner.writer import DurableWriter
from afk_local.storage.format.records import Checkpoint, ErrorInfo, RunMeta, RunStatus
from afk_local.storage.rundir.write.writer import RunWriter
from afk_local.storage.store import Store

log = logging.getLogger("afk_local")


@dataclass
class ReplayReport:
    """What a replay of one run found (``afk-local replay RUN --json`` prints it).

    Attributes:
        run_id: the run.
        status: the run's status (``completed``, ``running``, ``failed``...).
        divergence: the first divergence, or None when the code reproduces the journal.
        recorded: how many calls the run journaled.
        replayed: how many of them the code asked and got from the journal.
        frontier: where a resume would go live (a key and why), or None (the job
            returned, or diverged first).
        raised: the exception the replayed code raised, if any (``ValueError: ...``).
        old_branches: the patch ids for which this run takes the old branch
            (``ctx.patched`` is False at some point of it).
    """

    run_id: str
    status: str
    divergence: ReplayDivergence | None
    recorded: int
    replayed: int
    frontier: str | None = None
    raised: str | None = None
    old_branches: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when the current code reproduces the run's journal."""
        return self.divergence is None

    def to_json(self) -> dict[str, Any]:
        """The report as plain data."""
        d = self.divergence
        return {
            "run_id": self.run_id,
            "status": self.status,
            "ok": self.ok,
            "recorded": self.recorded,
            "replayed": self.replayed,
            "frontier": self.frontier,
            "raised": self.raised,
            "old_branches": self.old_branches,
            "divergence": None
            if d is None
            else {
                "position": d.position,
                "key": d.key,
                "kind": d.kind,
                "recorded": d.recorded,
                "asked": d.asked,
                "advice": d.advice,
            },
        }


class _ReplayRun:
    """What a run context reads of its run while replaying: the meta and the seq."""

    def __init__(self, meta: RunMeta, seq: int) -> None:
        self.meta = meta
        self.seq = seq
        self.run_id = meta.run_id


class ReplayWriter(DurableWriter):
    """The writer of a replayed attempt: it serves the replay journal and writes nothing."""

    def __init__(self, journal: ReplayJournal, meta: RunMeta, seq: int) -> None:
        # No DurableWriter.__init__: no run writer, no queue, no thread, no atexit hook.
        self.run = cast(RunWriter, _ReplayRun(meta, seq))
        self.durability = "sync"
        self._journal = journal

    def __repr__(self) -> str:
        return f"ReplayWriter(run_id={self.run_id!r})"

    @property
    def run_id(self) -> str:
        """The run replayed."""
        return self._journal.run_id

    @property
    def effects(self) -> Journal:
        """The replay journal."""
        return self._journal

    @property
    def pending(self) -> int:
        """Nothing is ever queued."""
        return 0

    @property
    def closed(self) -> bool:
        """Never closed: there is nothing to close."""
        return False

    @property
    def failed(self) -> BaseException | None:
        """Never failed: nothing is written."""
        return None

    def checkpoint(self, phase: Any, payload: Any, *, step: int, metrics: Any = None) -> None:
        """Dropped: a replay writes nothing."""

    def flush(self) -> None:
        """Nothing to flush."""

    def update_meta(self, **changes: Any) -> None:
        """Dropped: a replay writes nothing."""

    def pause(self, kind: str = "input", prompt: Any = None, **extra: Any) -> Checkpoint:
        """The run waits for input here: a resume goes on from this point."""
        raise self._journal.frontier_at(str(extra.get("key", "@pause")), "the run waits here")

    def finish(self, result: Any = None, **extra: Any) -> Checkpoint:
        """Never called on a replay (the driver keeps the result)."""
        raise AssertionError("a replay does not finish its run")

    def fail(self, error: BaseException | ErrorInfo | str, **extra: Any) -> Checkpoint:
        """Never called on a replay."""
        raise AssertionError("a replay does not fail its run")

    def cancel(self, reason: str = "cancelled") -> Checkpoint:
        """Never called on a replay."""
        raise AssertionError("a replay does not cancel its run")

    def close(self) -> None:
        """Close the replay journal."""
        self._journal.close()


def replay_job(
    fn: Callable[..., Any],
    store: Store,
    meta: RunMeta,
    *,
    version: str | None,
    skip_empty: bool = False,
) -> tuple[ReplayReport, dict[str, bool]]:
    """Run ``fn`` (the job's current code) against run ``meta``'s journal; nothing is written.

    Returns the report and the ``ctx.patched`` decisions the replay made (journal key ->
    decision) for the attempt that may follow. ``skip_empty``: a run that journaled no
    call is not replayed (there is nothing the code could depart from).
    """
    reader = store.open(meta.run_id)
    journal = ReplayJournal(reader.paths.journal, meta.run_id, record_codec=store.codec)
    try:
        if skip_empty and not journal.recorded:
            return ReplayReport(meta.run_id, str(meta.status), None, 0, 0), {}
        return _replay(fn, store, meta, journal, version=version, reader=reader)
    finally:
        journal.close()


def _replay(
    fn: Callable[..., Any],
    store: Store,
    meta: RunMeta,
    journal: ReplayJournal,
    *,
    version: str | None,
    reader: Any,
) -> tuple[ReplayReport, dict[str, bool]]:
    latest = reader.latest() if meta.status is RunStatus.COMPLETED else None
    writer = ReplayWriter(journal, meta, latest.seq if latest is not None else 0)
    ctx = RunContext(
        writer, store, state={}, cursors={}, version=version, attempt=meta.attempt, resumed=True
    )
    ctx.park_after = None  # a replayed wait never parks: it stops at the frontier
    params = meta.params if isinstance(meta.params, dict) else {}
    args, kwargs = list(params.get("args") or []), dict(params.get("kwargs") or {})
    returned, result, raised = False, None, None
    try:
        with running(ctx):
            result = _call(fn, ctx, args, kwargs)
        returned = True
    except ReplayFrontier:
        pass  # kept on the journal
    except ReplayDivergence as exc:  # kept on the journal, unless the job raised its own
        if journal.divergence is None:  # (ctx.deprecate_patch on a run of the old branch)
            journal.divergence = exc
    except AgentRequestMismatchError as exc:  # an agent's model call asks something else
        if journal.divergence is None:
            journal.divergence = ReplayDivergence(
                journal.run_id, journal.position_of(exc.key), exc.key,
                f"{exc.key}: the request the run sent",
                "; ".join(exc.differences) or "another request", kind="arguments",
            )  # fmt: skip
    except Exception as exc:
        raised = f"{type(exc).__name__}: {exc}"
    if journal.divergence is None and returned:
        with contextlib.suppress(ReplayDivergence):  # kept on the journal
            journal.finished()
    if journal.divergence is None and meta.status is RunStatus.COMPLETED:
        _check_finished(journal, reader, returned, result, raised)
    report = ReplayReport(
        run_id=meta.run_id,
        status=str(meta.status),
        divergence=journal.divergence,
        recorded=len(journal.recorded),
        replayed=journal.replayed_count,
        frontier=None if journal.frontier is None else str(journal.frontier),
        raised=raised,
        old_branches=_old_branches(journal),
    )
    return report, dict(journal.patch_decisions)


def _call(fn: Callable[..., Any], ctx: RunContext, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """Call the job body; an ``async def`` one runs to its end on an event loop of its own."""
    if not inspect.iscoroutinefunction(fn):
        return fn(ctx, *args, **kwargs)

    async def body() -> Any:
        return await fn(ctx, *args, **kwargs)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(body())
    # Called from inside a running loop (an async job's resume): a loop of its own in a
    # thread, so that the caller's loop is never re-entered.
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="afk-replay") as thread:
        return thread.submit(asyncio.run, body()).result()


def _check_finished(
    journal: ReplayJournal, reader: Any, returned: bool, result: Any, raised: str | None
) -> None:
    """A finished run: the code must return, past no unrecorded call, the recorded result."""
    recorded = reader.resume_state().result
    count = len(journal.recorded) + 1
    if journal.frontier is not None:
        key = journal.frontier.key
        journal.divergence = ReplayDivergence(
            journal.run_id, count, key, "nothing (the run had finished)",
            f"{key} ({journal.frontier.why})", kind="step",
        )  # fmt: skip
    elif not returned:
        journal.divergence = ReplayDivergence(
            journal.run_id, count, "(result)", f"the result {_short(recorded)}",
            f"an exception: {raised}", kind="raised",
        )  # fmt: skip
    elif result_hash(result) != result_hash(recorded):
        journal.divergence = ReplayDivergence(
            journal.run_id, count, "(result)", f"the result {_short(recorded)}",
            f"the result {_short(result)}", kind="result",
        )  # fmt: skip


def _old_branches(journal: ReplayJournal) -> list[str]:
    """The patch ids the run takes the old branch of (journaled or decided in this replay)."""
    old = {patch_id_of(key) for key, taken in journal.patch_decisions.items() if not taken}
    keys = journal.keys()
    for key in keys:
        if is_patch_key(key):
            state = Journal.lookup(journal, key)
            outcome = state.outcome if state is not None else None
            if outcome is not None and outcome.result is False:
                old.add(patch_id_of(key))
    return sorted(old)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def check_before_resume(
    fn: Callable[..., Any], store: Store, meta: RunMeta, *, version: str | None
) -> dict[str, bool]:
    """The replay check a resume runs first; returns the ``ctx.patched`` decisions it made.

    The job's body runs once more, from the top, with its output (``sys.stdout``) dropped;
    a run that journaled no call is not replayed.

    Raises:
        ReplayDivergence: (``refused=True``, one line) the code diverges from the journal;
            nothing was run or written.
    """
    # What the body prints while it is only replayed would read as work done twice.
    with open(os.devnull, "w", encoding="utf-8") as quiet, contextlib.redirect_stdout(quiet):
        report, decisions = replay_job(fn, store, meta, version=version, skip_empty=True)
    d = report.divergence
    if d is not None:
        raise ReplayDivergence(
            d.run_id, d.position, d.key, d.recorded, d.asked, kind=d.kind, refused=True
        )
    return decisions


__all__ = ["ReplayReport", "ReplayWriter", "check_before_resume", "replay_job"]
