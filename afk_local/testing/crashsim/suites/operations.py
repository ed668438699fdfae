"""Workloads of the operations that write besides checkpoints: status changes, removal, time.

Each is one thing a user or the watcher does to a run (cancel it, pause it and answer,
settle an effect, tag it, remove it, park it asleep, claim an attempt and back off), or
a condition the run meets (a keyed store with head records, a wall clock that steps
back): the explorer holds every crash state to what the operation
acknowledged, as for the job workloads (:mod:`.workloads`).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from afk_local.clock import using_clock, wall_ns
from afk_local.errors import EffectInDoubtError, RunPaused, RunSleeping
from afk_local.journal.journal import journal_of
from afk_local.runner.operations.cancel import cancel
from afk_local.runner.operations.resume import resume_job
from afk_local.runner.operations.settle import settle
from afk_local.runner.run.answers import waiting_at
from afk_local.storage import fsio
from afk_local.storage.format.records import RunStatus
from afk_local.storage.store import Store
from afk_local.testing.clock import SkippingClock
from afk_local.testing.crashsim.jobs import (
    approval_job,
    count_job,
    one_step_job,
    sleepy_job,
    tagged_job,
)
from afk_local.testing.crashsim.trace import Session
from afk_local.testing.crashsim.workloads import (
    InDoubt,
    ResumeFailed,
    Workload,
    continue_runs,
    state_payload,
    write_run,
)
from afk_local.watcher.attempts import attempt_died, claim

_KEY = "crashsim key"


class SteppingClock:
    """The wall clock, stepped back ``by`` seconds once it was read ``after`` times (an NTP
    correction, a user setting the time): stamps taken later are earlier than some taken
    before."""

    def __init__(self, *, after: int, by: float) -> None:
        self._after = after
        self._by = by
        self._reads = 0
        self._lock = threading.Lock()

    def time(self) -> float:
        """Seconds since the epoch, stepped back once ``after`` readings were taken."""
        with self._lock:
            self._reads += 1
            stepped = self._reads > self._after
        return wall_ns() / 1e9 - (self._by if stepped else 0.0)

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of real time."""
        time.sleep(seconds)


def _clock_step_record(session: Session, _prepared: Any) -> None:
    with using_clock(SteppingClock(after=2, by=3.0)):
        done = count_job.with_store(session.store).run(3, run_id="stepped")
    session.checkpoints_acked("stepped")
    session.status_acked("stepped")  # completed: a resume must not run it again
    if done != {"count": 3}:
        raise ResumeFailed(f"the recorded run returned {done!r}")


def _clock_step_resume(store: Store) -> dict[str, Any]:
    try:
        return {"stepped": count_job.with_store(store).run(3, run_id="stepped")}
    except EffectInDoubtError as exc:
        return {"stepped": InDoubt(exc.key)}


def _keyed_job_record(session: Session, _prepared: Any) -> None:
    # A clock that stands still (a coarse one, or a fast run): every later_ms stamp of
    # run.meta is then ahead of the checkpoints' own stamps.
    with using_clock(SkippingClock()):
        done = count_job.with_store(session.store).run(3, run_id="keyed")
    session.checkpoints_acked("keyed")
    session.status_acked("keyed")
    if done != {"count": 3}:
        raise ResumeFailed(f"the recorded run returned {done!r}")


def _keyed_job_resume(store: Store) -> dict[str, Any]:
    return {"keyed": count_job.with_store(store).run(3, run_id="keyed")}


def _rm_record(session: Session, _prepared: Any) -> None:
    store = session.store
    done = one_step_job.with_store(store).run(7, run_id="gone")
    if done != {"sent": 7}:
        raise ResumeFailed(f"the recorded run returned {done!r}")
    session.run_removed("gone")
    kept = store.delete("gone", keep_effects=True)  # afk-local rm, right after it finished
    if kept is None:
        raise ResumeFailed("rm kept no journal")
    session.files_kept(kept)  # its effects.log and run.meta, whatever comes next
    session.rewrite_done("gone", "rm")  # and the run stays deleted


def _rm_resume(store: Store) -> dict[str, Any]:
    if not store.exists("gone"):
        return {}
    try:
        return {"gone": one_step_job.with_store(store).run(7, run_id="gone")}
    except EffectInDoubtError as exc:
        return {"gone": InDoubt(exc.key)}


def _interrupted_setup(store: Store, _scratch: Path) -> None:
    write_run(store, "run", 3)  # running, nobody owns it: interrupted


def _cancel_record(session: Session, _prepared: Any) -> None:
    cancel("run", store=session.store)
    session.checkpoints_acked("run")
    session.status_acked("run")  # cancelled: nothing may resume it from here on


def _cancel_resume(store: Store) -> dict[str, Any]:
    if store.read_meta("run").status is not RunStatus.CANCELLED:
        cancel("run", store=store)  # the user runs the command again
    return {"run": store.read_meta("run").status.value}


def _pause_record(session: Session, _prepared: Any) -> None:
    with session.store.resume_writer("run") as run:
        run.pause("input", "go on?")
    session.checkpoints_acked("run")
    session.status_acked("run")  # paused, waiting for input


def _pause_resume(store: Store) -> dict[str, Any]:
    if store.read_meta("run").status is not RunStatus.PAUSED:
        with store.resume_writer("run") as run:
            run.pause("input", "go on?")
    return {"run": store.read_meta("run").status.value}


def _lagging_setup(store: Store, _scratch: Path) -> None:
    write_run(store, "run", 5)
    files = store.open("run").checkpoint_files()
    # A kill between the newest checkpoint's rename and the swap of latest left latest
    # one behind; a second such kill in the next attempt must not leave it two behind.
    fsio.atomic_symlink(files[-2].name, store.paths("run").latest)


def _lagging_record(session: Session, _prepared: Any) -> None:
    session.checkpoints_acked("run", upto=4, since=0)  # 5 never was: latest did not move
    with session.store.resume_writer("run") as run:  # the next attempt: latest repaired
        run.checkpoint("runtime_state", state_payload(5), step=5)
    session.checkpoints_acked("run")


def _in_doubt_setup(store: Store, _scratch: Path) -> None:
    write_run(store, "run", 2, effects=1)
    with store.resume_writer("run") as run:  # an intent whose call was killed midway
        journal_of(run).record_intent(
            "charge", name="charge", input_hash="0" * 16, idempotency_key="run:charge"
        )


def _settle_record(session: Session, _prepared: Any) -> None:
    settle("run", "charge", store=session.store, done=True, result={"charged": 1})
    session.outcomes_acked("run", ["charge"])  # settled: the resume replays it
    session.checkpoints_acked("run")


def _park_record(session: Session, _prepared: Any) -> None:
    try:
        sleepy_job.with_store(session.store).run(5, run_id="sleeper")
    except RunSleeping:
        pass
    else:
        raise ResumeFailed("the recorded run did not park")
    session.status_acked("sleeper")  # sleeping until its wake time: not interrupted


def _park_resume(store: Store) -> dict[str, Any]:
    if store.exists("sleeper") and store.read_meta("sleeper").status is RunStatus.SLEEPING:
        return {"sleeper": "sleeping"}
    try:  # interrupted before it parked: the job runs again, and parks
        sleepy_job.with_store(store).run(5, run_id="sleeper")
    except RunSleeping:
        return {"sleeper": store.read_meta("sleeper").status.value}
    return {"sleeper": "did not park"}


_ANSWER = "approved"


def _paused_setup(store: Store, _scratch: Path) -> None:
    try:
        approval_job.with_store(store).run(5, run_id="asked")
    except RunPaused:
        return
    raise ResumeFailed("the job did not pause")


def _answer_record(session: Session, _prepared: Any) -> None:
    store = session.store
    seq = waiting_at(store.read_meta("asked"))  # afk-local resume asked --input ...
    done = resume_job(store, "asked", input=_ANSWER, pause_seq=seq)
    session.outcomes_acked("asked")  # the answer, journaled: later resumes return it
    session.checkpoints_acked("asked")
    session.status_acked("asked")  # completed: the answer is never asked for again
    if done != {"amount": 5, "answer": _ANSWER}:
        raise ResumeFailed(f"the answered run returned {done!r}")


def _answer_resume(store: Store) -> dict[str, Any]:
    if store.read_meta("asked").status is not RunStatus.PAUSED:
        try:  # completed (the stored result), or interrupted: the attempt runs again
            return {"asked": approval_job.with_store(store).run(5, run_id="asked")}
        except RunPaused:
            pass  # the answer was not journaled yet: the run asks again
    seq = waiting_at(store.read_meta("asked"))  # a person answers the pause it shows
    return {"asked": resume_job(store, "asked", input=_ANSWER, pause_seq=seq)}


def _tags_record(session: Session, _prepared: Any) -> None:
    done = tagged_job.with_store(session.store).run(2, run_id="tagged", tags={"owner": "ann"})
    session.checkpoints_acked("tagged")
    session.status_acked("tagged")
    session.meta_acked("tagged", "extra.tags")  # the tags as the job left them
    if done != {"count": 2}:
        raise ResumeFailed(f"the recorded run returned {done!r}")


def _tags_resume(store: Store) -> dict[str, Any]:
    return {"tagged": tagged_job.with_store(store).run(2, run_id="tagged")}


class _Attempts:
    """The settings and events of a watcher, for its attempt bookkeeping (AttemptHost)."""

    max_attempts = 3
    backoff = 30.0
    max_backoff = 600.0
    lease = 60.0

    def __init__(self, store: Store) -> None:
        self.store = store

    def emit(self, kind: str, run_id: str | None = None, message: str = "", **fields: Any) -> None:
        """Events are not checked here."""

    def forget(self, run_id: str) -> None:
        """Nothing is cached."""


def _unowned_setup(store: Store, _scratch: Path) -> None:
    params = {"args": [3], "kwargs": {}}
    with store.create("run", entrypoint=count_job.entrypoint, params=params) as run:
        run.checkpoint("runtime_state", state_payload(0), step=0)  # interrupted


def _claim_record(session: Session, _prepared: Any) -> None:
    host = _Attempts(session.store)
    taken = claim(host, "run", manual=False)
    if taken is None or taken.meta.watcher_attempts != 1:
        raise ResumeFailed(f"the watcher did not claim the run: {taken!r}")
    session.meta_acked("run", "watcher_attempts")  # counted: max_attempts holds across
    # crashes (the attempt's death below keeps the count)
    log = session.base / "attempt.log"
    attempt_died(host, "run", 1, seq_at_start=taken.seq_at_start, code=-9, log_path=log)
    session.meta_acked("run", "next_attempt_ms")  # the backoff: no attempt before it


OPERATION_WORKLOADS: tuple[Workload, ...] = (
    Workload(
        "park",
        "a job that sleeps 5 hours: its checkpoint, the journaled due time, then the run "
        "parked (run.meta sleeping with wake_at) and the attempt ended",
        _park_record,
        _park_resume,
        {"sleeper": "sleeping"},
    ),
    Workload(
        "settle",
        "afk-local settle of an effect in doubt (done, with its result): the outcome "
        "appended to the run's journal under its lock",
        _settle_record,
        continue_runs("run"),
        {"run": "resumed"},
        setup=_in_doubt_setup,
    ),
    Workload(
        "cancel",
        "afk-local cancel of an interrupted run: a cancelled terminal checkpoint, then "
        "run.meta says cancelled (and why)",
        _cancel_record,
        _cancel_resume,
        {"run": "cancelled"},
        setup=_interrupted_setup,
    ),
    Workload(
        "cancel-keyed",
        "the cancel workload in a keyed store (its head record moves with each meta)",
        _cancel_record,
        _cancel_resume,
        {"run": "cancelled"},
        setup=_interrupted_setup,
        key=_KEY,
    ),
    Workload(
        "pause",
        "a run paused for input: its paused checkpoint, then run.meta says paused",
        _pause_record,
        _pause_resume,
        {"run": "paused"},
        setup=_interrupted_setup,
    ),
    Workload(
        "latest-behind",
        "the attempt after a kill that left latest one behind: latest repaired first, "
        "then a checkpoint (a second kill must not leave it two behind)",
        _lagging_record,
        continue_runs("run"),
        {"run": "resumed"},
        setup=_lagging_setup,
    ),
    Workload(
        "rm",
        "afk-local rm of a run right after it completed (its run.meta never fsynced): the "
        "journal and meta kept under removed/, then the run directory deleted",
        _rm_record,
        _rm_resume,
        {"gone": {"sent": 7}},
    ),
    Workload(
        "sync-keyed",
        "a sync job in a keyed store: its head record moves with every durable write, and "
        "a crash must never leave it ahead of the run (a rollback reported, a retry refused)",
        _keyed_job_record,
        _keyed_job_resume,
        {"keyed": {"count": 3}},
        key=_KEY,
    ),
    Workload(
        "clock-step-keyed",
        "a sync job in a keyed store (head records) whose wall clock steps back 3 s after "
        "the run began: its terminal checkpoint is stamped before the meta it replaces",
        _clock_step_record,
        _clock_step_resume,
        {"stepped": {"count": 3}},
        key=_KEY,
    ),
    Workload(
        "answer",
        "the answer to a paused run (afk-local resume RUN --input, bound to its pause): "
        "journaled, then the run goes on and completes",
        _answer_record,
        _answer_resume,
        {"asked": {"amount": 5, "answer": _ANSWER}},
        setup=_paused_setup,
    ),
    Workload(
        "tags",
        "a job run with tags that changes them as it goes (ctx.tags): each change a "
        "rewrite of run.meta, the last ones kept with the completed run",
        _tags_record,
        _tags_resume,
        {"tagged": {"count": 2}},
    ),
    Workload(
        "watcher-claim",
        "the watcher's bookkeeping of an interrupted run nobody owns: an attempt claimed "
        "(watcher_attempts, lease) under the run's lock, then its death and backoff",
        _claim_record,
        continue_runs("run"),
        {"run": "resumed"},
        setup=_unowned_setup,
    ),
)
"""The operation workloads, in the order the explorer runs them."""


__all__ = ["OPERATION_WORKLOADS", "SteppingClock"]
