"""Schedules and the clock: the local zone by name across DST, marks from a future clock,
a removed schedule's mark, on the time-skipping clock (no watcher process needed)."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import pytest
import time_jobs

import afk_local as afk
from afk_local.testing import SkippingClock
from afk_local.watcher.schedules import (
    Schedule,
    Scheduler,
    last_started_slot,
    remove_schedule,
    write_schedule,
)
from afk_local.watcher.slots import Timing


class Host:
    """The part of a watcher the scheduler needs: the store, and a list of events."""

    def __init__(self, store: afk.Store) -> None:
        self.store = store
        self.events: list[tuple[str, str | None, str]] = []

    def emit(self, kind: str, run_id: str | None = None, message: str = "", /) -> None:
        self.events.append((kind, run_id, message))


def utc(*when: int) -> float:
    return dt.datetime(*when, tzinfo=dt.timezone.utc).timestamp()


def slots(store: afk.Store, name: str) -> list[dt.datetime]:
    found = []
    for run_id in sorted(store.run_ids()):
        if run_id.startswith(f"{name}--"):
            stamp = run_id.split("--", 1)[1]
            found.append(dt.datetime.strptime(stamp, "%Y%m%dT%H%M%SZ"))
    return found


@pytest.fixture
def new_york(monkeypatch: pytest.MonkeyPatch):
    """The machine's local zone is America/New_York (by $TZ, as on a laptop set to it)."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_local_cron_fires_once_on_the_dst_fall_back_night_at_local_time(
    afk_store: afk.Store, afk_clock: SkippingClock, new_york: None
) -> None:
    pytest.importorskip("cronsim", reason="--cron needs the schedule extra (cronsim)")
    afk_clock.set(utc(2026, 10, 30, 12))
    write_schedule(
        afk_store, Schedule(name="night", entrypoint="time_jobs:stamp", cron="30 1 * * *")
    )
    scheduler = Scheduler(Host(afk_store))
    while afk_clock.time() < utc(2026, 11, 2, 12):  # a sweep every 10 minutes for 3 days
        scheduler.start_due_runs()
        afk_clock.advance(600)
    # 01:30 New York time each night: EDT (05:30Z) until the fall-back night, whose 01:30
    # comes twice and fires once (the first), then EST (06:30Z)
    assert slots(afk_store, "night") == [
        dt.datetime(2026, 10, 31, 5, 30),
        dt.datetime(2026, 11, 1, 5, 30),
        dt.datetime(2026, 11, 2, 6, 30),
    ]


def test_the_local_zone_is_read_at_the_test_clocks_time(new_york: None) -> None:
    pytest.importorskip("cronsim", reason="--cron needs the schedule extra (cronsim)")
    summer = Timing(cron="0 9 * * *")  # no timezone: the local one
    latest = summer.latest(utc(2026, 7, 10, 15))
    assert dt.datetime.fromtimestamp(latest, dt.timezone.utc) == dt.datetime(
        2026, 7, 10, 13, 0, tzinfo=dt.timezone.utc
    )  # 09:00 EDT, whatever the real date is


def test_a_mark_from_a_clock_that_was_ahead_is_repaired(
    afk_store: afk.Store, afk_clock: SkippingClock
) -> None:
    start = 1000 * 3600.0
    afk_clock.set(start)
    write_schedule(afk_store, Schedule(name="tick", entrypoint="time_jobs:stamp", every_s=60))
    scheduler = Scheduler(Host(afk_store))
    afk_clock.set(start + 30 * 86400)  # the clock ran 30 days ahead for one sweep...
    assert len(scheduler.start_due_runs()) == 1
    afk_clock.set(start + 125)  # ...and was put right
    made = scheduler.start_due_runs()
    assert made == [Schedule(name="tick", entrypoint="x:y", every_s=60).run_id(start + 120)]
    assert last_started_slot(afk_store, "tick") == start + 120
    afk_clock.advance(60)
    assert len(scheduler.start_due_runs()) == 1  # and it goes on from there


def test_a_schedule_removed_and_added_again_does_not_keep_the_old_mark(
    afk_store: afk.Store, afk_clock: SkippingClock
) -> None:
    start = 1000 * 3600.0
    afk_clock.set(start + 5)
    hourly = Schedule(name="report", entrypoint="time_jobs:stamp", every_s=3600)
    write_schedule(afk_store, hourly)
    afk_clock.advance(3600)
    assert len(Scheduler(Host(afk_store)).start_due_runs()) == 1
    assert remove_schedule(afk_store, "report")
    assert last_started_slot(afk_store, "report") is None

    write_schedule(afk_store, Schedule(name="report", entrypoint="time_jobs:stamp", every_s=60))
    afk_clock.advance(60)
    assert len(Scheduler(Host(afk_store)).start_due_runs()) == 1


def test_a_mark_left_by_an_earlier_schedule_of_the_same_name_is_ignored(
    afk_store: afk.Store, afk_clock: SkippingClock, tmp_path: Path
) -> None:
    # the mark of a schedule replaced by `schedule add` (same name, new schedule)
    start = 1000 * 3600.0
    afk_clock.set(start + 5)
    write_schedule(afk_store, Schedule(name="r", entrypoint="time_jobs:stamp", every_s=3600))
    afk_clock.advance(3600)
    Scheduler(Host(afk_store)).start_due_runs()
    afk_clock.set(start - 7200)  # the clock stepped back two hours; the schedule made anew
    write_schedule(afk_store, Schedule(name="r", entrypoint="time_jobs:stamp", every_s=60))
    afk_clock.advance(61)
    assert len(Scheduler(Host(afk_store)).start_due_runs()) == 1


def test_a_scheduled_run_knows_its_slot_also_when_started_late(
    afk_store: afk.Store, afk_clock: SkippingClock
) -> None:
    start = 1000 * 3600.0
    afk_clock.set(start + 5)
    write_schedule(afk_store, Schedule(name="r", entrypoint="time_jobs:slot_job", every_s=3600))
    afk_clock.advance(3600 + 1500)  # 25 minutes late
    (run_id,) = Scheduler(Host(afk_store)).start_due_runs()
    assert afk.resume(run_id, store=afk_store) == "1970-02-11T17:00:00+00:00"  # 1001 h after epoch
    assert afk_store.read_meta(run_id).extra["tags"] == {
        "schedule": "r",
        "schedule.slot": "1970-02-11T17:00:00+00:00",
    }
    assert time_jobs.slot_job.with_store(afk_store).run(run_id="by-hand") is None


def _overlapping(store: afk.Store, clock: SkippingClock, overlap: str) -> tuple[Scheduler, str]:
    """A 60 s schedule whose first run is made and then left running (unfinished)."""
    start = 1000 * 3600.0
    clock.set(start + 5)
    write_schedule(
        store,
        Schedule(name="o", entrypoint="time_jobs:slot_job", every_s=60, overlap=overlap),
    )
    scheduler = Scheduler(Host(store))
    clock.advance(60)
    (first,) = scheduler.start_due_runs()
    return scheduler, first


def _finish(store: afk.Store, run_id: str) -> None:
    afk.resume(run_id, store=store)
    assert store.read_meta(run_id).status is afk.RunStatus.COMPLETED


def test_overlap_skip_skips_slots_while_the_previous_run_is_unfinished(
    afk_store: afk.Store, afk_clock: SkippingClock, tmp_path: Path
) -> None:
    scheduler, first = _overlapping(afk_store, afk_clock, "skip")
    for _ in range(2):
        afk_clock.advance(60)
        assert scheduler.start_due_runs() == []  # the first run is still 'created'
    skipped = [e[1] for e in scheduler.host.events if e[0] == "skipped"]
    assert skipped == ["o--19700211T160200Z", "o--19700211T160300Z"]
    _finish(afk_store, first)
    afk_clock.advance(60)
    assert scheduler.start_due_runs() == ["o--19700211T160400Z"]  # the skipped ones are gone


def test_overlap_queue_starts_the_waiting_slot_once_the_previous_run_ended(
    afk_store: afk.Store, afk_clock: SkippingClock, tmp_path: Path
) -> None:
    scheduler, first = _overlapping(afk_store, afk_clock, "queue")
    afk_clock.advance(30)
    afk_clock.advance(30)
    assert scheduler.start_due_runs() == []  # waits: the first run is unfinished
    _finish(afk_store, first)
    assert scheduler.start_due_runs() == ["o--19700211T160200Z"]  # its slot, late


def test_overlap_allow_starts_every_slot(afk_store: afk.Store, afk_clock: SkippingClock) -> None:
    scheduler, _ = _overlapping(afk_store, afk_clock, "allow")
    afk_clock.advance(60)
    assert scheduler.start_due_runs() == ["o--19700211T160200Z"]
