"""The records afk_local stores, as msgspec Structs.

These shapes are the on-disk format (docs/format.md, docs/agent.md): fields are only ever added
with defaults, never renamed, so older files keep decoding. ``SCHEMA_VERSION``
changes when a field's meaning changes; ``migrate.py`` upgrades old records.
"""

from __future__ import annotations

import enum
import traceback
from typing import Any

import msgspec

from afk_local.clock import clock_ms

SCHEMA_VERSION = 1
"""Schema version written into every Checkpoint and RunMeta."""

MAX_NESTING_DEPTH = 256
"""Deepest nesting of lists and maps a record may have, the record itself counting as 1
(a checkpoint's payload is level 2). Deeper records are refused when written
(:class:`~afk_local.errors.RecordTooDeepError`, before any I/O): Python decodes nested
msgpack recursively, and a reader near its recursion limit (the CLI, a watcher child)
could not read them back. A deeper record on disk reads as damaged, never as a crash."""


class Phase(str, enum.Enum):
    """The checkpoint phases of the agent protocol (docs/agent.md)."""

    RUN_STARTED = "run_started"
    STEP_STARTED = "step_started"
    PRE_LLM = "pre_llm"
    POST_LLM = "post_llm"
    PRE_TOOL_BATCH = "pre_tool_batch"
    POST_TOOL_BATCH = "post_tool_batch"
    PRE_SUBAGENT_BATCH = "pre_subagent_batch"
    POST_SUBAGENT_BATCH = "post_subagent_batch"
    PAUSED = "paused"
    RESUMED = "resumed"
    RUNTIME_STATE = "runtime_state"
    RUN_TERMINAL = "run_terminal"

    def __str__(self) -> str:
        return self.value


META_COPY_KEY = "run_meta"
"""The ``run_terminal`` payload key holding the bytes of the ``run.meta`` written just
after it (status ``completed`` or ``failed``). That ``run.meta`` is written without an
fsync (docs/guarantees.md, "What a new run costs"): a power cut may leave it torn, and
readers then take this copy, which the terminal checkpoint made durable."""


class RunStatus(str, enum.Enum):
    """Where a run is in its life, as recorded in ``run.meta``."""

    CREATED = "created"
    RUNNING = "running"
    PAUSED = "paused"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    SLEEPING = "sleeping"
    """Parked in a long ``ctx.sleep``: no process runs it until ``RunMeta.wake_at_ms``."""

    def __str__(self) -> str:
        return self.value

    @property
    def is_terminal(self) -> bool:
        """True for statuses after which nothing runs unless a person asks."""
        return self in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)

    @property
    def is_final(self) -> bool:
        """True for statuses no resume ever continues: ``completed`` and ``cancelled``.

        A ``failed`` run is terminal but not final: a retry resumes it and replays
        its effect journal, so nothing it needs may be thrown away.
        """
        return self in (RunStatus.COMPLETED, RunStatus.CANCELLED)

    @property
    def expects_owner(self) -> bool:
        """True for ``created`` and ``running``: a process should be running the run now.

        Only these statuses are ever resumed automatically; such a run whose lock
        nobody holds is interrupted
        (:func:`~afk_local.storage.rundir.ownership.is_interrupted`).
        """
        return self in (RunStatus.CREATED, RunStatus.RUNNING)


class Checkpoint(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """One immutable checkpoint of a run: ``<seq:012d>.<phase>.ckpt``."""

    schema_version: int
    run_id: str
    thread_id: str | None
    seq: int
    step: int
    phase: str
    timestamp_ms: int
    payload: Any
    journal_records: int | None = None
    """How many records of the run's effect journal were durable when this checkpoint
    was taken: its position in the journal, which a fork inherits exactly. None in
    checkpoints written before afk_local recorded it (then left out of the file)."""


class OwnerInfo(msgspec.Struct, kw_only=True, frozen=True):
    """Who owns a run, for display and for filesystems without working locks."""

    pid: int
    hostname: str
    boot_id: str
    process_start: int
    """Start time of the owning process in clock ticks since boot (0 where unknown)."""


class ErrorInfo(msgspec.Struct, kw_only=True, frozen=True):
    """A structured exception: type name, message, optional traceback text."""

    type: str
    message: str
    traceback: str | None = None


def error_info(error: BaseException | ErrorInfo | str) -> ErrorInfo:
    """The one way an exception becomes an :class:`ErrorInfo` record.

    An exception gives its type name, message and formatted traceback; a string is a
    message of type ``"Error"``; an :class:`ErrorInfo` is returned as it is.
    """
    if isinstance(error, ErrorInfo):
        return error
    if isinstance(error, str):
        return ErrorInfo(type="Error", message=error)
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return ErrorInfo(type=type(error).__name__, message=str(error), traceback=text)


LANGGRAPH_IDLE_PAUSE_KIND = "langgraph_idle"
"""The pause kind a LangGraph saver gives a thread it closes: the thread is idle (its
graph finished, or waits at an ``interrupt``) until the graph is invoked again."""
SESSION_PAUSE_KIND = "conversation"
"""The pause kind of a ``RunSession``'s checkpoints (each holds the whole history)."""
IDLE_PAUSE_KINDS = frozenset({LANGGRAPH_IDLE_PAUSE_KIND, SESSION_PAUSE_KIND})
"""Pause kinds of a thread kept by the code that uses it (a LangGraph saver, a
``RunSession``): nothing waits for a resume or a person's answer; that code continues it
when it next writes. Listings show such a run as an idle thread, not as one that needs
someone."""


class PauseInfo(msgspec.Struct, kw_only=True, frozen=True):
    """Why a run is paused and what it asked for."""

    kind: str
    prompt: Any = None
    seq: int = 0

    @property
    def idle(self) -> bool:
        """An idle thread's pause (:data:`IDLE_PAUSE_KINDS`), not a wait for anyone."""
        return self.kind in IDLE_PAUSE_KINDS


class RunMeta(msgspec.Struct, kw_only=True, frozen=True):
    """The mutable facts about a run (``run.meta``), replaced atomically on change."""

    schema_version: int = SCHEMA_VERSION
    run_id: str
    thread_id: str | None = None
    status: RunStatus = RunStatus.CREATED
    created_ms: int
    updated_ms: int
    entrypoint: str | None = None
    params: Any = None
    parent_run_id: str | None = None
    owner: OwnerInfo | None = None
    attempt: int = 0
    """How many times a process has opened the run for writing (1 for the first run)."""
    watcher_attempts: int = 0
    """Consecutive automatic resumes by a watcher since the run last made progress."""
    next_attempt_ms: int = 0
    """Earliest time a watcher may resume the run again (crash-loop backoff)."""
    code_fingerprint: str | None = None
    version: str | None = None
    error: ErrorInfo | None = None
    pause: PauseInfo | None = None
    extra: dict[str, Any] = {}
    wake_at_ms: int = 0
    """For ``sleeping`` runs: when a watcher resumes it (wall clock, ms); 0 otherwise."""


class Effect(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """One record of the effect journal: an ``intent`` or an ``outcome``."""

    kind: str
    """``"intent"`` (durable before the call) or ``"outcome"`` (durable before use)."""
    key: str
    timestamp_ms: int
    step: int = 0
    call_id: str | None = None
    name: str = ""
    input_hash: str = ""
    idempotency_key: str = ""
    status: str | None = None
    """For outcomes: ``"ok"`` or ``"error"``."""
    output_hash: str | None = None
    result: Any = None
    error: ErrorInfo | None = None
    settled_attempt: int = 0
    """For outcomes a person recorded (``afk-local settle``): the run's ``attempt`` then
    (at least 1); 0 for outcomes the call itself recorded. ``settle --undo`` is allowed
    while the run's attempt is still this one (no resume has consumed the settlement)."""
    reopened: bool = False
    """For intents: re-recorded by ``afk-local settle --undo`` (the call is in doubt again)."""
    args_text: str = ""
    """For intents: the call's arguments in words (``'a', 10, currency='eur'``), bounded to
    200 characters (``afk_local.journal.replay.render_call``), for messages and
    ``afk-local replay``; empty in journals written before it (their input hash still holds)."""


def now_ms() -> int:
    """Wall-clock milliseconds, as stored in records (the process's clock: afk_local.clock)."""
    return clock_ms()


WAITING_KEY = "waiting"
"""``run.meta`` extra while a step waits under a :class:`~afk_local.Limit` (``afk-local show``)."""

IMPORTED_KEY = "imported"
"""``RunMeta.extra`` key of a run made by ``afk-local import``: ``{"source": FILE,
"imported_ms": ms}``. Such a run is never executed until someone trusts it (the trust
gate, ``afk_local.storage.trust``, reads it)."""


def imported_mark(source: str) -> dict[str, Any]:
    """The ``RunMeta.extra[IMPORTED_KEY]`` an import records."""
    return {"source": source, "imported_ms": now_ms()}


def later_ms(previous: int) -> int:
    """The ``updated_ms`` of a record replacing one stamped ``previous``: now, but always later.

    ``run.meta`` stamps only ever grow, so a copy put back (an older meta) is told
    from a newer one even when the clock stepped back.
    """
    return max(now_ms(), previous + 1)
