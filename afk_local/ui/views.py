"""What each page of ``afk-local ui`` shows, as plain data read from the store.

The runs page uses the store's own listing (:func:`~afk_local.storage.listing.page_runs`
with a :class:`~afk_local.storage.views.run_filter.RunFilter`), the run page the
same rows as ``afk-local effects`` (:func:`~afk_local.storage.views.effect_table.effect_rows`)
and ``afk-local metrics``. Nothing here writes.
"""

from __future__ import annotations

import bisect
import itertools
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from afk_local.errors import AfkLocalError, RunNotFoundError, run_failure
from afk_local.runner.code.origin import cannot_resume
from afk_local.runner.run.answers import waiting_at
from afk_local.runner.run.run_context import PAUSE_NAME
from afk_local.runner.time.sleeps import SLEEP_NAME
from afk_local.storage.format.records import Phase, RunMeta, RunStatus, now_ms
from afk_local.storage.listing import page_runs
from afk_local.storage.ops.export import to_jsonable
from afk_local.storage.ops.retention import RetentionPolicy
from afk_local.storage.rundir.read.metrics import MetricLog, read_metrics
from afk_local.storage.store import Store
from afk_local.storage.views.effect_table import effect_rows
from afk_local.storage.views.notebook import format_bytes, format_ms
from afk_local.storage.views.payload_diff import structural_diff
from afk_local.storage.views.run_filter import LIVENESS, RunFilter, parse_since, parse_tag
from afk_local.storage.views.run_info import RunInfo
from afk_local.storage.views.run_progress import (
    format_duration,
    format_position,
    format_progress,
    progress_of,
)
from afk_local.ui.logs import AttemptLog, attempt_logs

log = logging.getLogger("afk_local")

PAGE_SIZE = 50
"""Runs on one page of the runs page."""
MAX_PAGE_SIZE = 500
"""The most runs one page may ask for (``?per=``)."""
TIMELINE_LIMIT = 200
"""Events shown on a run's timeline (the newest)."""
MAX_SHOWN_JSON = 256 << 10
"""Characters of a payload shown on a page before it is cut."""
MAX_SHOWN_TEXT = 300
"""Characters of a name, tag list or other one-line text from the store shown before it is cut."""
MAX_SHOWN_ERROR = 4000
"""Characters of a run's error message shown before it is cut."""
MAX_EFFECT_ROWS = 500
"""Effects listed on a run's page (those in doubt first); ``afk-local effects`` lists all."""
MAX_DIFF_ROWS = 1000
"""Paths listed on a diff page; ``afk-local diff`` lists all."""
MAX_SHOWN_TRACEBACK = 8000
"""Characters of a failure's stored traceback shown (its end: the innermost frames)."""
MAX_NEEDS_YOU = 10
"""Runs listed under "Needs you" on the runs page (newest first; a filter lists all)."""
MAX_LIVENESS_CHECKS = 50
"""Runs marked running whose process the "Needs you" list checks (newest first)."""
METRIC_CHECKPOINTS = 2000
"""The newest checkpoints a run's page reads metrics from (``afk-local metrics`` reads all)."""
STATUSES = tuple(s.value for s in RunStatus) + LIVENESS
"""What the status filter offers."""


@dataclass(frozen=True)
class RunsQuery:
    """The runs page's filters and page, as given in its query string."""

    status: str = ""
    name: str = ""
    tag: str = ""
    since: str = ""
    page: int = 1
    per: int = PAGE_SIZE

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> RunsQuery:
        """Read the query string; a value out of range is clamped, never an error."""

        def number(key: str, default: int, top: int) -> int:
            try:
                return max(1, min(top, int(params.get(key, default))))
            except ValueError:
                return default

        status = params.get("status", "")
        return cls(
            status=status if status in STATUSES else "",
            name=params.get("name", "").strip()[:200],
            tag=params.get("tag", "").strip()[:200],
            since=params.get("since", "").strip()[:50],
            page=number("page", 1, 1 << 30),
            per=number("per", PAGE_SIZE, MAX_PAGE_SIZE),
        )

    def run_filter(self) -> RunFilter:
        """The :class:`RunFilter` these filters mean.

        Raises:
            ValueError: ``since`` or ``tag`` does not parse (the message says the forms).
        """
        tags = dict(parse_tag(t) for t in self.tag.split()) if self.tag else {}
        since_ms = parse_since(self.since, now_ms()) if self.since else None
        return RunFilter(
            status=self.status or None, since_ms=since_ms, name=self.name or None, tags=tags
        )

    def params(self, **changes: Any) -> dict[str, str]:
        """The query string of this page with ``changes`` (empty values left out)."""
        values = {
            "status": self.status,
            "name": self.name,
            "tag": self.tag,
            "since": self.since,
            "page": str(self.page) if self.page != 1 else "",
            "per": str(self.per) if self.per != PAGE_SIZE else "",
        }
        values.update({k: str(v) for k, v in changes.items()})
        return {k: v for k, v in values.items() if v}


@dataclass(frozen=True)
class RunRow:
    """One line of the runs table, formatted."""

    run_id: str
    status: str
    label: str
    progress: str
    fraction: float | None
    eta: str
    attempts: int
    age: str
    updated: str
    tags: str
    size: str
    damage: str | None
    needs: str = ""
    """Why the run waits for a person (the "Needs you" list), "" when it does not."""


def run_row(info: RunInfo, now: int) -> RunRow:
    """The runs table's line of one run (the same facts as ``afk-local runs``)."""
    if info.not_started:
        label = "created (not started)"
    elif info.idle:
        label = "paused (idle thread)"
    elif info.interrupted:
        label = f"{info.status.value} (interrupted)"
    elif info.owner_alive:
        label = f"{info.status.value} (live)"
    else:
        label = info.status.value
    p = info.progress
    return RunRow(
        run_id=info.run_id,
        status=info.status.value,
        label=label,
        progress=format_progress(p),
        fraction=p.fraction if p else None,
        eta=format_duration(info.eta_s) if info.eta_s is not None else "-",
        attempts=info.attempt,
        age=format_duration(max(0, now - info.created_ms) / 1000) if info.created_ms else "-",
        updated=format_ms(info.updated_ms),
        tags=" ".join(f"{k}={v}" for k, v in sorted(info.tags.items())),
        size=format_bytes(info.bytes),
        damage=info.damage,
    )


def _in_doubt(store: Store, run_id: str) -> int:
    """How many effects of ``run_id`` are in doubt (0 when its journal cannot be read)."""
    try:
        return sum(1 for row in effect_rows(store.open(run_id)) if row["state"] == "in_doubt")
    except AfkLocalError:
        return 0


def needs_you(store: Store) -> tuple[list[RunRow], int]:
    """The runs that wait for a person, newest change first (at most :data:`MAX_NEEDS_YOU`),
    and how many there are: paused (an answer), failed, and interrupted (a crash left
    them; effects in doubt are named). Statuses come from the store's meta index (one
    ``stat`` per run); only the runs shown, and at most :data:`MAX_LIVENESS_CHECKS` runs
    marked running, are read."""
    if not store.runs_dir.is_dir():
        return [], 0
    waiting: list[tuple[int, str]] = []
    running: list[tuple[int, str]] = []
    for run_id, summary in store.meta_index().summaries().items():
        if summary.status in (RunStatus.PAUSED.value, RunStatus.FAILED.value):
            waiting.append((summary.updated_ms, run_id))
        elif summary.status == RunStatus.RUNNING.value:
            running.append((summary.updated_ms, run_id))
    running.sort(reverse=True)
    for updated, run_id in running[:MAX_LIVENESS_CHECKS]:
        try:
            if store.info(run_id).interrupted:
                waiting.append((updated, run_id))
        except AfkLocalError:
            continue
    waiting.sort(reverse=True)
    rows, now, idle = [], now_ms(), 0
    for _, run_id in waiting[:MAX_NEEDS_YOU]:
        try:
            info = store.info(run_id)
        except AfkLocalError:
            continue
        if info.idle:  # a LangGraph thread or a conversation: its own code continues it
            idle += 1
            continue
        doubt = _in_doubt(store, run_id) if info.status is not RunStatus.PAUSED else 0
        if doubt:
            why = f"{doubt} effect(s) in doubt: settle them"
        elif info.status is RunStatus.PAUSED:
            why = "waits for an answer"
        elif info.status is RunStatus.FAILED:
            why = "failed"
        else:
            why = "interrupted: resume it"
        rows.append(replace(run_row(info, now), needs=why))
    return rows, len(waiting) - idle


@dataclass
class RunsPage:
    """What the runs page shows."""

    query: RunsQuery
    rows: list[RunRow] = field(default_factory=list)
    matched: int | None = 0
    """Runs the filters admit (None: not counted, that would read the whole store)."""
    more: bool = False
    error: str | None = None


def runs_page(store: Store, query: RunsQuery) -> RunsPage:
    """The runs of one page, newest first, filtered."""
    page = RunsPage(query=query)
    try:
        wanted = query.run_filter()
    except ValueError as exc:
        page.error = str(exc)
        return page
    if not store.runs_dir.is_dir():
        return page
    infos, page.matched, page.more = page_runs(
        store, wanted, (query.page - 1) * query.per, query.per
    )
    now = now_ms()
    page.rows = [run_row(info, now) for info in infos]
    return page


def rows_of(store: Store, run_ids: list[str]) -> RunsPage:
    """The rows of the runs ``run_ids`` (at most :data:`MAX_PAGE_SIZE`), as the runs page
    shows them: what a page fetches when the runs it shows changed. A run that is gone,
    refused or unreadable has no row."""
    page = RunsPage(query=RunsQuery())
    now = now_ms()
    for run_id in dict.fromkeys(run_ids[:MAX_PAGE_SIZE]):
        try:
            require_run(store, run_id)
            page.rows.append(run_row(store.info(run_id), now))
        except AfkLocalError:
            continue
    return page


@dataclass(frozen=True)
class TimelineEvent:
    """One thing that happened in a run: an attempt, checkpoints, a step, a pause, a sleep."""

    at_ms: int
    kind: str
    """``attempt`` (a process started the run), ``checkpoint`` (one or a run of alike
    checkpoints), ``pause`` (it waits for a person), ``answer`` (a pause's answer),
    ``sleep`` (a durable ``ctx.sleep``), ``step`` (a journaled call, from its intent to
    its outcome) or ``end`` (the run did)."""
    what: str
    detail: str = ""
    seq: int | None = None
    step: int | None = None
    """The run's step then (a journaled call's own step), None when not known."""
    count: int = 1
    """Alike checkpoints in a row (same phase and step) shown as this one line."""
    last_seq: int | None = None
    """The newest of those checkpoints (None: one checkpoint)."""
    took: str = ""
    """How long it lasted: a step from intent to outcome, a run of checkpoints first to last."""


def format_took(ms: int) -> str:
    """A duration for the timeline: ``850 ms``, ``2.4 s``, ``3m05s``."""
    if ms < 1000:
        return f"{max(0, ms)} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    return format_duration(ms / 1000)


def group_timeline(events: list[TimelineEvent]) -> list[TimelineEvent]:
    """``events`` oldest first, each run of alike checkpoints (same phase, same step) made one
    line that says how many and how long, so a loop's thousand ``runtime_state`` checkpoints
    read as one line per step."""
    grouped: list[TimelineEvent] = []
    for event in sorted(events, key=lambda e: e.at_ms):
        last = grouped[-1] if grouped else None
        if (
            last is not None
            and event.kind == last.kind == "checkpoint"
            and (event.what, event.step) == (last.what, last.step)
        ):
            first_detail = last.detail.split(" to ", 1)[0] if last.count > 1 else last.detail
            detail = first_detail
            if event.detail and event.detail != first_detail:
                detail = f"{first_detail} to {event.detail}" if first_detail else event.detail
            grouped[-1] = replace(
                last,
                count=last.count + 1,
                last_seq=event.seq,
                detail=detail,
                took=format_took(event.at_ms - last.at_ms),
            )
            continue
        grouped.append(event)
    return grouped


def _checkpoint_event(ckpt: Any) -> TimelineEvent:
    """A checkpoint as the timeline tells it: its phase says what happened, its detail
    where the run stood (:func:`~afk_local.storage.views.run_progress.format_position`)."""
    payload = ckpt.payload if isinstance(ckpt.payload, dict) else {}
    at, seq, step = ckpt.timestamp_ms, ckpt.seq, ckpt.step
    where = format_position(ckpt.step, progress_of(payload))
    if ckpt.phase == Phase.RUN_STARTED.value:
        what = "attempt started (a resume)" if payload.get("resumed") else "attempt started"
        return TimelineEvent(at, "attempt", what, where, seq, step)
    if ckpt.phase == Phase.PAUSED.value:
        kind = payload.get("kind")
        what = f"paused: waits for {kind}" if isinstance(kind, str) else "paused"
        return TimelineEvent(at, "pause", shown_text(what), where, seq, step)
    if ckpt.phase == Phase.RUN_TERMINAL.value:
        state = payload.get("state")
        what = f"run {state}" if isinstance(state, str) else "run ended"
        return TimelineEvent(at, "end", shown_text(what), where, seq, step)
    return TimelineEvent(at, "checkpoint", ckpt.phase, where, seq, step)


def _effect_events(row: dict[str, Any]) -> list[TimelineEvent]:
    """A journaled call as the timeline tells it: a step from its intent to its outcome, a
    pause's answer (``@pause``) or a sleep's due time (``@sleep``)."""
    name = shown_text(row["name"] or row["key"])
    if row["name"] == PAUSE_NAME:
        if row["outcome_ms"] and row["state"] == "ok":
            return [TimelineEvent(row["outcome_ms"], "answer", "pause answered")]
        return []
    if row["name"] == SLEEP_NAME:
        if row["outcome_ms"] and isinstance(row["result"], int):
            return [
                TimelineEvent(
                    row["outcome_ms"], "sleep", f"sleeps until {format_ms(row['result'])}"
                )
            ]
        return []
    began, ended = row["intent_ms"], row["outcome_ms"]
    if not began and not ended:
        return []
    state = "IN DOUBT" if row["state"] == "in_doubt" else str(row["state"])
    took = format_took(ended - began) if began and ended else ""
    return [TimelineEvent(began or ended, "step", name, state, step=row["step"], took=took)]


def _timeline(
    reader: Any, files: list[Any], effects: list[dict[str, Any]]
) -> tuple[list[TimelineEvent], Any]:
    """The events of ``files`` (checkpoints) and ``effects`` (effect rows), unsorted, and
    the payload of the newest of ``files`` that ends the run (None: none does)."""
    timeline: list[TimelineEvent] = []
    ended: Any = None
    for file in files:
        try:
            ckpt = reader.load(file)
        except AfkLocalError as exc:
            timeline.append(TimelineEvent(0, "checkpoint", file.phase, run_failure(exc), file.seq))
            continue
        timeline.append(_checkpoint_event(ckpt))
        if ckpt.phase == Phase.RUN_TERMINAL.value:
            ended = ckpt.payload
    for row in effects:
        timeline.extend(_effect_events(row))
    return timeline, ended


@dataclass
class RunPage:
    """What a run's page shows."""

    info: RunInfo
    meta: RunMeta
    row: RunRow
    pause_seq: int | None
    pause_prompt: str | None
    error: str | None
    params: str | None
    effects: list[dict[str, Any]]
    """The first :data:`MAX_EFFECT_ROWS` rows of ``afk-local effects`` (in doubt first)."""
    effects_total: int
    effects_problem: str | None
    timeline: list[TimelineEvent]
    checkpoints: int
    metrics: MetricLog
    metrics_problem: str | None
    undoable: frozenset[str] = frozenset()
    """Effects whose settlement can still be undone (``afk-local settle --undo``)."""
    logs: list[AttemptLog] = field(default_factory=list)
    """The watcher's newest attempt logs, newest first."""
    position: str = ""
    """Where the run stood at its newest checkpoint (``12 of 40 items done, step 3``)."""
    traceback: str | None = None
    """The failure's stored traceback (its end, when long)."""
    innermost: str | None = None
    """The innermost frame of that traceback: where the error was raised."""
    result: str | None = None
    """A completed run's result, as JSON."""
    can_resume: bool = False
    """A resume through the watcher can work: not live, not ended, resumable code."""
    can_cancel: bool = False
    """Cancel can work: not ended, and no live process holds the run."""
    metrics_cut: bool = False
    """Metrics were read from the newest :data:`METRIC_CHECKPOINTS` checkpoints only."""
    needs: str = ""
    """What the run waits for a person to do ("" when nothing)."""


def innermost_frame(traceback: str) -> str | None:
    """The last ``File "...", line N, in f`` of a Python traceback, with its source line."""
    lines = traceback.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].lstrip().startswith('File "'):
            source = lines[i + 1].strip() if i + 1 < len(lines) else ""
            frame = lines[i].strip()
            if source and not source.startswith(("File ", "^", "~")):
                return f"{frame}\n    {source}"
            return frame
    return None


def undoable_settlements(effects: list[Any], attempt: int) -> frozenset[str]:
    """The keys whose last record is an outcome a person settled during ``attempt``.

    The rule of :func:`~afk_local.runner.operations.settle.unsettle`: a settlement stands once a
    resume has started since (the run's attempt moved on), so only those of the
    current attempt (``max(attempt, 1)``) can be taken back.
    """
    last: dict[str, Any] = {}
    for record in effects:
        last[record.key] = record
    current = max(attempt, 1)
    return frozenset(
        key
        for key, record in last.items()
        if record.kind == "outcome" and record.settled_attempt == current
    )


def shown_text(text: object, limit: int = MAX_SHOWN_TEXT) -> str:
    """``text`` (what a store holds: any length) cut to ``limit`` characters for a page."""
    text = "" if text is None else str(text)
    return text if len(text) <= limit else text[: max(0, limit - 3)] + "..."


def shown_json(value: Any) -> str:
    """``value`` as indented JSON for a page, cut at :data:`MAX_SHOWN_JSON` characters."""
    text = json.dumps(to_jsonable(value), indent=2, ensure_ascii=False, default=repr)
    if len(text) > MAX_SHOWN_JSON:
        return text[:MAX_SHOWN_JSON] + "\n... (cut; `afk-local inspect` shows all of it)"
    return text


def require_run(store: Store, run_id: str) -> None:
    """Raise :class:`RunNotFoundError` (or :class:`InvalidRunIdError`) unless it is a run."""
    paths = store.paths(run_id, refuse_links=True)
    if not os.path.lexists(paths.meta):
        raise RunNotFoundError(run_id, str(store.root))


def run_page(store: Store, run_id: str) -> RunPage:
    """Everything the run page shows about ``run_id``."""
    require_run(store, run_id)
    info = store.info(run_id)
    reader = store.open(run_id)
    meta = reader.meta
    effects: list[dict[str, Any]] = []
    effects_problem = None
    undoable: frozenset[str] = frozenset()
    try:
        effects = effect_rows(reader)
        if effects:
            undoable = undoable_settlements(reader.effects(), meta.attempt)
    except AfkLocalError as exc:
        effects_problem = str(exc)
    effects_total = len(effects)
    files = reader.checkpoint_files()
    timeline, ended = _timeline(reader, files[-TIMELINE_LIMIT:], effects)
    first = files[0] if files else None
    started = first is None or (first.seq == 1 and first.phase != Phase.RUN_STARTED.value)
    if started and meta.attempt >= 1:
        # A durable job's new run writes no run_started (docs/guarantees.md, "What a new
        # run costs"): its first attempt began when the run was made.
        timeline.append(TimelineEvent(meta.created_ms, "attempt", "attempt started"))
    if meta.status is RunStatus.SLEEPING and meta.wake_at_ms:
        timeline.append(
            TimelineEvent(
                meta.updated_ms,
                "sleep",
                f"parked until {format_ms(meta.wake_at_ms)}",
                "`afk-local watch` wakes it then",
            )
        )
    timeline = group_timeline(timeline)[::-1]
    metrics = MetricLog()
    metrics_problem = None
    try:
        metrics = read_metrics(reader, newest=METRIC_CHECKPOINTS, files=files)
    except AfkLocalError as exc:
        metrics_problem = str(exc)
    pause_seq = waiting_at(meta)
    traceback = meta.error.traceback if meta.error is not None else None
    result = None
    if (
        meta.status is RunStatus.COMPLETED
        and isinstance(ended, dict)
        and "terminal_result" in ended
    ):
        result = shown_json(ended["terminal_result"])
    ended_status = meta.status in (RunStatus.COMPLETED, RunStatus.CANCELLED)
    live = info.owner_alive
    return RunPage(
        info=info,
        meta=meta,
        row=run_row(info, now_ms()),
        pause_seq=pause_seq,
        pause_prompt=shown_json(meta.pause.prompt) if meta.pause is not None else None,
        error=(
            shown_text(f"{meta.error.type}: {meta.error.message}", MAX_SHOWN_ERROR)
            if meta.error is not None
            else None
        ),
        params=shown_json(meta.params) if meta.params is not None else None,
        effects=effects[:MAX_EFFECT_ROWS],
        effects_total=effects_total,
        effects_problem=effects_problem,
        timeline=timeline[:TIMELINE_LIMIT],
        checkpoints=len(files),
        metrics=metrics,
        metrics_problem=metrics_problem,
        undoable=undoable,
        logs=attempt_logs(reader.paths.dir),
        position=format_position(info.step, info.progress),
        traceback=(
            traceback
            if not traceback or len(traceback) <= MAX_SHOWN_TRACEBACK
            else "...\n" + traceback[-MAX_SHOWN_TRACEBACK:]
        ),
        innermost=innermost_frame(traceback) if traceback else None,
        result=result,
        can_resume=(
            not live
            and meta.status in (RunStatus.FAILED, RunStatus.RUNNING, RunStatus.CREATED)
            and bool(meta.entrypoint)
            and cannot_resume(meta) is None
        ),
        can_cancel=not live and not ended_status,
        metrics_cut=len(files) > METRIC_CHECKPOINTS,
        needs=_needs(meta, info, sum(1 for e in effects if e["state"] == "in_doubt")),
    )


def _needs(meta: RunMeta, info: RunInfo, in_doubt: int) -> str:
    """What a run's page asks of a person, first thing."""
    if in_doubt:
        return f"{in_doubt} effect(s) in doubt: check what happened and settle them below"
    if meta.status is RunStatus.PAUSED and meta.pause is not None and meta.pause.idle:
        return ""  # an idle thread: the code that keeps it continues it
    if meta.status is RunStatus.PAUSED:
        return "it waits for your answer below"
    if meta.status is RunStatus.FAILED:
        return "it failed: see where below, then resume, restart or cancel it"
    if info.interrupted:
        return "its process is gone: resume it (through the watcher) below"
    return ""


def runs_by_itself(page: RunPage) -> bool:
    """The run changes without anyone acting: a live process runs it, or a watcher is due
    to start it (``created``) or wake it (``sleeping``).

    A run waiting for a person (paused, interrupted, failed with effects in doubt) is
    not: its page holds the forms a person types in, which a reload would wipe out.
    """
    return page.info.owner_alive or page.meta.status in (RunStatus.CREATED, RunStatus.SLEEPING)


@dataclass(frozen=True)
class CheckpointPage:
    """One checkpoint, for the inspect page."""

    run_id: str
    seq: int
    phase: str
    step: int
    position: str
    """Where the run stood (``12 of 40 items done, step 3``; ``""``: nothing known)."""
    at: str
    payload: str
    prev_seq: int | None = None
    next_seq: int | None = None
    first_seq: int = 0
    last_seq: int = 0
    kept: int = 0
    """Checkpoints the run keeps (the diff form asks for a seq: no list of them all)."""


def checkpoint_page(store: Store, run_id: str, seq: int) -> CheckpointPage:
    """The payload of checkpoint ``seq`` of ``run_id`` (as ``afk-local inspect``)."""
    require_run(store, run_id)
    reader = store.open(run_id)
    ckpt = reader.get(seq)
    seqs = [f.seq for f in reader.checkpoint_files()]
    at = bisect.bisect_left(seqs, ckpt.seq)
    after = at + 1 if at < len(seqs) and seqs[at] == ckpt.seq else at
    return CheckpointPage(
        run_id=run_id,
        seq=ckpt.seq,
        phase=ckpt.phase,
        step=ckpt.step,
        position=format_position(ckpt.step, progress_of(ckpt.payload)),
        at=format_ms(ckpt.timestamp_ms),
        payload=shown_json(ckpt.payload),
        prev_seq=seqs[at - 1] if at > 0 else None,
        next_seq=seqs[after] if after < len(seqs) else None,
        first_seq=seqs[0] if seqs else ckpt.seq,
        last_seq=seqs[-1] if seqs else ckpt.seq,
        kept=len(seqs),
    )


@dataclass(frozen=True)
class DiffPage:
    """What changed from one checkpoint's payload to another's (as ``afk-local diff``)."""

    run_id: str
    seq_a: int
    seq_b: int
    phase_a: str
    phase_b: str
    added: list[tuple[str, str]]
    removed: list[tuple[str, str]]
    changed: list[tuple[str, str, str]]
    total: int = 0
    """Paths that differ (each list holds at most :data:`MAX_DIFF_ROWS`)."""


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=repr)
    return text if len(text) <= 200 else text[:197] + "..."


def diff_page(store: Store, run_id: str, seq_a: int, seq_b: int) -> DiffPage:
    """The structural diff of two checkpoints of ``run_id`` (paths, as ``afk-local diff``)."""
    require_run(store, run_id)
    reader = store.open(run_id)
    a, b = reader.get(seq_a), reader.get(seq_b)
    changes = structural_diff(a.payload, b.payload)
    shown = _first_paths(changes, MAX_DIFF_ROWS)
    return DiffPage(
        run_id=run_id,
        seq_a=a.seq,
        seq_b=b.seq,
        phase_a=a.phase,
        phase_b=b.phase,
        added=[(shown_text(path), _short(v)) for path, v in shown["added"]],
        removed=[(shown_text(path), _short(v)) for path, v in shown["removed"]],
        changed=[
            (shown_text(path), _short(old), _short(new)) for path, (old, new) in shown["changed"]
        ],
        total=sum(len(changes[part]) for part in _DIFF_PARTS),
    )


_DIFF_PARTS = ("added", "removed", "changed")


def _first_paths(changes: dict[str, Any], limit: int) -> dict[str, list[tuple[str, Any]]]:
    """The first ``limit`` paths of a structural diff, added ones first, then removed, changed."""
    shown: dict[str, list[tuple[str, Any]]] = {}
    for part in _DIFF_PARTS:
        shown[part] = list(itertools.islice(changes[part].items(), limit))
        limit -= len(shown[part])
    return shown


MAX_STORE_ROWS = 50
"""Runs each list of the store page names (the biggest, those gc deletes or compacts)."""


@dataclass
class StorePage:
    """What the store page shows: disk use by run, what gc would remove, verify results."""

    root: str
    runs: int = 0
    total_bytes: str = "0 B"
    by_size: list[tuple[str, str]] = field(default_factory=list)
    gc: dict[str, Any] = field(default_factory=dict)
    """``afk-local gc --dry-run``'s report, its lists cut to :data:`MAX_STORE_ROWS`."""
    gc_deleted: int = 0
    """Runs gc would delete (``gc["deleted_runs"]`` names the first)."""
    gc_compacted: int = 0
    """Runs gc would compact (``gc["compacted"]`` holds the first)."""
    gc_freed: str = "0 B"
    verified: list[tuple[str, int, list[str]]] | None = None
    """The runs verify found problems in (at most :data:`MAX_STORE_ROWS`)."""
    verified_runs: int = 0
    verified_bad: int = 0


def store_page(store: Store, *, verify: bool = False, top: int = MAX_STORE_ROWS) -> StorePage:
    """The store page; reads every run (and with ``verify`` every file): computed off the
    request (:mod:`~afk_local.ui.store_stats`), its lists cut to ``top`` runs."""
    page = StorePage(root=str(store.root))
    if not store.runs_dir.is_dir():
        return page
    infos = store.runs()
    page.runs = len(infos)
    page.total_bytes = format_bytes(sum(i.bytes for i in infos))
    biggest = sorted(infos, key=lambda i: i.bytes, reverse=True)[:top]
    page.by_size = [(i.run_id, format_bytes(i.bytes)) for i in biggest]
    report = store.gc(RetentionPolicy(), dry_run=True)
    gc = report.to_dict()
    compacted = [
        c
        for c in gc.get("compacted", [])
        if c.get("deleted_files") or c.get("rewritten_files") or c.get("effects_dropped")
    ]
    page.gc_deleted, page.gc_compacted = len(gc.get("deleted_runs", [])), len(compacted)
    gc["deleted_runs"] = gc.get("deleted_runs", [])[:top]
    gc["compacted"] = compacted[:top]
    gc["errors"] = gc.get("errors", [])[:top]
    page.gc = gc
    page.gc_freed = format_bytes(report.bytes_freed)
    if verify:
        page.verified = []
        for run_id in store.run_ids():
            page.verified_runs += 1
            try:
                result = store.open(run_id).verify()
            except AfkLocalError as exc:
                problems, checked = [str(exc)], 0
            else:
                problems = [f"{p.path}: {p.reason}" for p in result.problems]
                checked = result.checked_files
            if problems:
                page.verified_bad += 1
                if len(page.verified) < top:
                    page.verified.append((run_id, checked, problems[:top]))
    return page


__all__ = [
    "MAX_DIFF_ROWS",
    "MAX_EFFECT_ROWS",
    "MAX_PAGE_SIZE",
    "MAX_SHOWN_ERROR",
    "MAX_SHOWN_TEXT",
    "MAX_SHOWN_TRACEBACK",
    "MAX_STORE_ROWS",
    "METRIC_CHECKPOINTS",
    "PAGE_SIZE",
    "STATUSES",
    "CheckpointPage",
    "DiffPage",
    "RunPage",
    "RunRow",
    "RunsPage",
    "RunsQuery",
    "StorePage",
    "TimelineEvent",
    "checkpoint_page",
    "diff_page",
    "format_took",
    "group_timeline",
    "innermost_frame",
    "needs_you",
    "require_run",
    "rows_of",
    "run_page",
    "run_row",
    "runs_by_itself",
    "runs_page",
    "shown_json",
    "shown_text",
    "store_page",
    "undoable_settlements",
]
