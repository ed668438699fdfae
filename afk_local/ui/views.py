"""What each page of ``afk-local ui`` shows, as plain data read from the store.

The runs page uses the store's own listing (:func:`~afk_local.storage.listing.page_runs`
with a :class:`~afk_local.storage.views.run_filter.RunFilter`), the run page the
same rows as ``afk-local effects`` (:func:`~afk_local.storage.views.effect_table.effect_rows`)
and ``afk-local metrics``. Nothing here writes.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from afk_local.errors import AfkLocalError, RunNotFoundError, run_failure
from afk_local.runner.answers import waiting_at
from afk_local.runner.run_context import PAUSE_NAME
from afk_local.runner.sleeps import SLEEP_NAME
from afk_local.storage.format.records import Phase, RunMeta, RunStatus, now_ms
from afk_local.storage.listing import page_runs
from afk_local.storage.ops.export import to_jsonable
from afk_local.storage.ops.retention import RetentionPolicy
from afk_local.storage.rundir.metrics import MetricLog
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


def run_row(info: RunInfo, now: int) -> RunRow:
    """The runs table's line of one run (the same facts as ``afk-local runs``)."""
    if info.interrupted:
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


@dataclass(frozen=True)
class TimelineEvent:
    """One thing that happened in a run: an attempt, a checkpoint, a step, a pause, a sleep."""

    at_ms: int
    kind: str
    """``attempt`` (a process started the run), ``checkpoint``, ``pause`` (it waits for
    a person), ``answer`` (a pause's answer), ``sleep`` (a durable ``ctx.sleep``),
    ``step`` (a journaled call began), ``outcome`` (it ended) or ``end`` (the run did)."""
    what: str
    detail: str = ""
    seq: int | None = None


def _checkpoint_event(ckpt: Any) -> TimelineEvent:
    """A checkpoint as the timeline tells it: its phase says what happened, its detail
    where the run stood (:func:`~afk_local.storage.views.run_progress.format_position`)."""
    payload = ckpt.payload if isinstance(ckpt.payload, dict) else {}
    at, seq = ckpt.timestamp_ms, ckpt.seq
    where = format_position(ckpt.step, progress_of(payload))
    if ckpt.phase == Phase.RUN_STARTED.value:
        what = "attempt started (a resume)" if payload.get("resumed") else "attempt started"
        return TimelineEvent(at, "attempt", what, where, seq)
    if ckpt.phase == Phase.PAUSED.value:
        kind = payload.get("kind")
        what = f"paused: waits for {kind}" if isinstance(kind, str) else "paused"
        return TimelineEvent(at, "pause", shown_text(what), where, seq)
    if ckpt.phase == Phase.RUN_TERMINAL.value:
        state = payload.get("state")
        what = f"run {state}" if isinstance(state, str) else "run ended"
        return TimelineEvent(at, "end", shown_text(what), where, seq)
    return TimelineEvent(at, "checkpoint", ckpt.phase, where, seq)


def _effect_events(row: dict[str, Any]) -> list[TimelineEvent]:
    """A journaled call as the timeline tells it: a step and its outcome, a pause's
    answer (``@pause``) or a sleep's due time (``@sleep``)."""
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
    events = []
    if row["intent_ms"]:
        events.append(TimelineEvent(row["intent_ms"], "step", name))
    if row["outcome_ms"]:
        events.append(TimelineEvent(row["outcome_ms"], "outcome", name, row["state"]))
    return events


def _timeline(reader: Any, files: list[Any], effects: list[dict[str, Any]]) -> list[TimelineEvent]:
    """The events of ``files`` (checkpoints) and ``effects`` (effect rows), unsorted."""
    timeline: list[TimelineEvent] = []
    for file in files:
        try:
            ckpt = reader.load(file)
        except AfkLocalError as exc:
            timeline.append(TimelineEvent(0, "checkpoint", file.phase, run_failure(exc), file.seq))
            continue
        timeline.append(_checkpoint_event(ckpt))
    for row in effects:
        timeline.extend(_effect_events(row))
    return timeline


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


def undoable_settlements(effects: list[Any], attempt: int) -> frozenset[str]:
    """The keys whose last record is an outcome a person settled during ``attempt``.

    The rule of :func:`~afk_local.runner.settle.unsettle`: a settlement stands once a
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
    timeline = _timeline(reader, files[-TIMELINE_LIMIT:], effects)
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
    timeline.sort(key=lambda e: e.at_ms, reverse=True)
    metrics = MetricLog()
    metrics_problem = None
    try:
        metrics = reader.metrics()
    except AfkLocalError as exc:
        metrics_problem = str(exc)
    pause_seq = waiting_at(meta)
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
    )


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
    seqs: list[int]


def checkpoint_page(store: Store, run_id: str, seq: int) -> CheckpointPage:
    """The payload of checkpoint ``seq`` of ``run_id`` (as ``afk-local inspect``)."""
    require_run(store, run_id)
    reader = store.open(run_id)
    ckpt = reader.get(seq)
    return CheckpointPage(
        run_id=run_id,
        seq=ckpt.seq,
        phase=ckpt.phase,
        step=ckpt.step,
        position=format_position(ckpt.step, progress_of(ckpt.payload)),
        at=format_ms(ckpt.timestamp_ms),
        payload=shown_json(ckpt.payload),
        seqs=[f.seq for f in reader.checkpoint_files()],
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


@dataclass
class StorePage:
    """What the store page shows: disk use by run, what gc would remove, verify results."""

    root: str
    runs: int = 0
    total_bytes: str = "0 B"
    by_size: list[tuple[str, str]] = field(default_factory=list)
    gc: dict[str, Any] = field(default_factory=dict)
    gc_freed: str = "0 B"
    verified: list[tuple[str, int, list[str]]] | None = None


def store_page(store: Store, *, verify: bool = False, top: int = 50) -> StorePage:
    """The store page; ``verify`` reads every file of every run (slow on large stores)."""
    page = StorePage(root=str(store.root))
    if not store.runs_dir.is_dir():
        return page
    infos = store.runs()
    page.runs = len(infos)
    page.total_bytes = format_bytes(sum(i.bytes for i in infos))
    biggest = sorted(infos, key=lambda i: i.bytes, reverse=True)[:top]
    page.by_size = [(i.run_id, format_bytes(i.bytes)) for i in biggest]
    report = store.gc(RetentionPolicy(), dry_run=True)
    page.gc = report.to_dict()
    page.gc_freed = format_bytes(report.bytes_freed)
    if verify:
        page.verified = []
        for run_id in store.run_ids():
            try:
                result = store.open(run_id).verify()
            except AfkLocalError as exc:
                page.verified.append((run_id, 0, [str(exc)]))
                continue
            problems = [f"{p.path}: {p.reason}" for p in result.problems]
            page.verified.append((run_id, result.checked_files, problems))
    return page


__all__ = [
    "MAX_DIFF_ROWS",
    "MAX_EFFECT_ROWS",
    "MAX_PAGE_SIZE",
    "MAX_SHOWN_ERROR",
    "MAX_SHOWN_TEXT",
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
    "require_run",
    "run_page",
    "run_row",
    "runs_by_itself",
    "runs_page",
    "shown_json",
    "shown_text",
    "store_page",
    "undoable_settlements",
]
