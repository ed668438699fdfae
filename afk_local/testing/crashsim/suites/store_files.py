"""Workloads of the files a store keeps beside its runs: schedules, limits, requests, identity.

Each writes what a person or the watcher writes there (``afk-local schedule add`` and
``rm``, the slots a watcher starts and its mark, the starts a shared :class:`Limit`
counts, resume requests and the rejected ones, ``afk-local adopt``), and acknowledges
each file once the call that wrote it returned: from then on every crash state must
hold it with those bytes (or, removed, without it).
"""

from __future__ import annotations

import shutil
from collections import deque
from pathlib import Path
from threading import Event
from typing import Any

from afk_local.runner.operations.adopt import adopt_store
from afk_local.runner.time.limits import LIMITS_DIR, Limit, limited
from afk_local.storage.store import Store
from afk_local.storage.store_identity import identity_path
from afk_local.testing.crashsim.jobs import count_job
from afk_local.testing.crashsim.trace import Session
from afk_local.testing.crashsim.workloads import (
    ResumeFailed,
    Workload,
    continue_run,
    continue_runs,
    write_run,
)
from afk_local.watcher.requests import (
    REJECTED_DIR,
    Request,
    pending_requests,
    process_requests,
    resume_request,
    write_request,
)
from afk_local.watcher.schedules import (
    Schedule,
    Scheduler,
    remove_schedule,
    schedules_dir,
    write_schedule,
)

_NOW = 1_800_000_000.0 + 1800
"""The schedule workload's clock time, half past an hour."""

_SLOTS = ("hourly--20270115T060000Z", "hourly--20270115T070000Z", "hourly--20270115T080000Z")
"""The runs of the slots due at :data:`_NOW` (hourly, created 3 h before, catch-up all)."""


class _Host:
    """The watcher as schedules and requests see it: its store, events ignored, a child
    "started" for each resume it asks (the run's lock decides who really resumes)."""

    concurrency = 2

    def __init__(self, store: Store) -> None:
        self.store = store
        self.stop_event = Event()
        self.pending: deque[str] = deque()
        self.children: dict[str, object] = {}
        self.started: list[str] = []

    def emit(self, kind: str, run_id: str | None = None, message: str = "", /) -> None:
        """Events are not checked here."""

    def start(
        self,
        run_id: str,
        *,
        manual: bool = False,
        input_json: str | None = None,
        pause_seq: int | None = None,
    ) -> bool:
        """Note the resume asked for."""
        self.started.append(run_id)
        return True


def _schedule(name: str) -> Schedule:
    return Schedule(
        name=name,
        entrypoint=count_job.entrypoint,
        args=[1],
        every_s=3600,
        catchup="all",
        created_ms=int((_NOW - 3 * 3600) * 1000),
    )


def _schedules_record(session: Session, _prepared: Any) -> None:
    store = session.store
    session.file_kept(write_schedule(store, _schedule("hourly")))  # afk-local schedule add
    made = Scheduler(_Host(store)).start_due_runs(_NOW)  # a watcher's sweep
    if tuple(made) != _SLOTS:
        raise ResumeFailed(f"the sweep started {made}, not {list(_SLOTS)}")
    for run_id in made:
        session.status_acked(run_id)  # created: the slot's run exists
    session.file_kept(schedules_dir(store) / "hourly.mark")  # no slot up to it starts again
    retired = write_schedule(store, _schedule("retired"))
    if not remove_schedule(store, "retired"):  # afk-local schedule rm
        raise ResumeFailed("schedule rm found nothing to remove")
    session.file_gone(retired)  # a watcher after a crash must not find it again


def _schedules_resume(store: Store) -> dict[str, Any]:
    if not (schedules_dir(store) / "hourly.json").is_file():
        return {}  # the schedule was never acknowledged
    Scheduler(_Host(store)).start_due_runs(_NOW)  # the next sweep
    return {"hourly": tuple(r for r in store.run_ids() if r.startswith("hourly--"))}


_LIMIT = Limit("api", concurrent=1, per_minute=5)
_RECORDED_STARTS = 3


def _limits_record(session: Session, _prepared: Any) -> None:
    for _ in range(_RECORDED_STARTS):
        with limited(session.store.root, _LIMIT):
            pass  # a step ran under the limit: its start counts, even after a crash
    session.file_kept(session.store.root / LIMITS_DIR / _LIMIT.name / "starts")


def _limits_resume(store: Store) -> dict[str, Any]:
    with limited(store.root, _LIMIT):  # a damaged window starts over, never blocks
        return {"api": "took a place"}


def _requests_setup(store: Store, _scratch: Path) -> None:
    # interrupted: a person asks the watcher to resume it
    params = {"args": [3], "kwargs": {}}
    with store.create("run", entrypoint=count_job.entrypoint, params=params) as run:
        run.checkpoint("runtime_state", {"items": []}, step=0)


def _requests_record(session: Session, _prepared: Any) -> None:
    store = session.store
    asked = resume_request(store, "run")  # afk-local resume run --via-watcher
    session.file_kept(asked)
    bad = write_request(store, Request(kind="resume", run_id="nosuch"))
    session.file_kept(bad)
    before = session.position
    host = _Host(store)
    process_requests(host)  # the watcher: resumes run, rejects the request for no run
    if host.started != ["run"] or pending_requests(store):
        raise ResumeFailed(f"the watcher started {host.started}, left {pending_requests(store)}")
    session.file_released(asked, since=before)  # handled: the watcher removed it
    session.file_released(bad, since=before)  # moved aside, with the reason:
    rejected = store.requests_dir / REJECTED_DIR
    session.file_kept(rejected / bad.name)
    session.file_kept(rejected / f"{bad.name}.reason")


def _requests_resume(store: Store) -> dict[str, Any]:
    process_requests(_Host(store))  # the watcher after the crash: whatever is left
    if pending_requests(store):
        return {"requests": [p.name for p in pending_requests(store)]}
    return {"requests": "handled", "run": continue_run(store, "run")}


def _moved_setup(store: Store, scratch: Path) -> None:
    home = Store(scratch / "home" / "store")
    write_run(home, "run", 3)
    shutil.rmtree(store.root, ignore_errors=True)
    shutil.copytree(home.root, store.root, symlinks=True)  # the store copied elsewhere


def _adopt_record(session: Session, _prepared: Any) -> None:
    report = adopt_store(session.store)  # afk-local adopt
    if report.moved_from is None:
        raise ResumeFailed("adopt found the store at home")
    session.file_kept(identity_path(session.store.root))  # its new home, from now on
    session.checkpoints_acked("run", since=0)


def _adopt_resume(store: Store) -> dict[str, Any]:
    adopt_store(store)  # a crash state is elsewhere again: the person adopts it there
    return continue_runs("run")(store)


STORE_FILE_WORKLOADS: tuple[Workload, ...] = (
    Workload(
        "schedules",
        "afk-local schedule add, a watcher's sweep starting the 3 due slots of an hourly "
        "schedule (each run created, then the mark moved), then schedule rm of another",
        _schedules_record,
        _schedules_resume,
        {"hourly": _SLOTS},
    ),
    Workload(
        "limits",
        "3 steps under a shared limit (1 at once, 5 a minute): each start counted in the "
        "limit's starts file before the step runs",
        _limits_record,
        _limits_resume,
        {"api": "took a place"},
    ),
    Workload(
        "requests",
        "afk-local resume --via-watcher of an interrupted run and a request for a run that "
        "does not exist; the watcher handles the first and moves the second to rejected/",
        _requests_record,
        _requests_resume,
        {"requests": "handled", "run": "resumed"},
        setup=_requests_setup,
    ),
    Workload(
        "adopt",
        "afk-local adopt of a copied store: its identity names the new home",
        _adopt_record,
        _adopt_resume,
        {"run": "resumed"},
        setup=_moved_setup,
        at_home=False,
    ),
)
"""The workloads of the store's own files, in the order the explorer runs them."""


__all__ = ["STORE_FILE_WORKLOADS"]
