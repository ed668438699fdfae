"""Schedules: one run per due slot, created create-only, so no slot ever runs twice.

Slot arithmetic and the watcher's sweeps run on a time-skipping clock (the machine
"off" for hours is one call); the two-watcher and reboot tests use real processes.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import proc
import pytest
import time_jobs
from cli_inproc import run_cli
from proc import REPO, SUPPORT, JsonLinesChild

import afk_local as afk
from afk_local.clock import ScaledClock
from afk_local.storage.format.records import OwnerInfo, RunStatus
from afk_local.testing import SkippingClock
from afk_local.watcher.schedules import Schedule, list_schedules, write_schedule
from afk_local.watcher.slots import Timing, due_slots
from afk_local.watcher.watcher import Watcher

ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(
        p for p in (str(SUPPORT), str(REPO), os.environ.get("PYTHONPATH", "")) if p
    ),
}
HOUR = 3600


def every(name: str, seconds: int, out: Path, *, catchup: str, created: float) -> Schedule:
    return Schedule(
        name=name,
        entrypoint="time_jobs:stamp",
        args=[str(out)],
        every_s=seconds,
        catchup=catchup,
        created_ms=int(created * 1000),
    )


def scheduled(store: afk.Store, name: str) -> list[str]:
    return sorted(r for r in store.run_ids() if r.startswith(f"{name}--"))


# -- slots ------------------------------------------------------------------------------


def test_every_slots_are_epoch_multiples_and_catchup_decides_the_missed_ones() -> None:
    timing = Timing(every_s=HOUR)
    created = 100 * HOUR + 600  # 10 min past an hour: that hour's slot does not count
    now = 105 * HOUR + 30  # five slots later, 30 s after the newest
    assert due_slots(timing, now, created=created, catchup="latest", newest_run=None) == [
        105 * HOUR
    ]
    assert due_slots(timing, now, created=created, catchup="all", newest_run=None) == [
        h * HOUR for h in range(101, 106)
    ]
    assert due_slots(timing, now, created=created, catchup="all", newest_run=103 * HOUR) == [
        104 * HOUR,
        105 * HOUR,
    ]
    assert due_slots(timing, now, created=created, catchup="skip", newest_run=None) == [
        105 * HOUR
    ]  # 30 s late: still fresh
    late = now + 120
    assert due_slots(timing, late, created=created, catchup="skip", newest_run=None) == []
    assert due_slots(timing, created + 1, created=created, catchup="all", newest_run=None) == []


def test_cron_slots_follow_the_time_zone() -> None:
    pytest.importorskip("cronsim", reason="--cron needs the schedule extra (cronsim)")
    berlin = Timing(cron="0 3 * * *", timezone="Europe/Berlin")
    now = dt.datetime(2026, 7, 10, 12, 0, tzinfo=dt.timezone.utc).timestamp()
    latest = berlin.latest(now)
    assert dt.datetime.fromtimestamp(latest, dt.timezone.utc) == dt.datetime(
        2026, 7, 10, 1, 0, tzinfo=dt.timezone.utc
    )  # 03:00 in Berlin summer time
    assert berlin.latest(latest) == latest  # a slot is its own latest
    three_days = berlin.slots_after(latest - 3 * 86400, now)
    assert [latest - d * 86400 for d in (2, 1, 0)] == three_days
    with pytest.raises(ValueError, match="cron"):
        write_schedule(afk.Store("/nonexistent-never-written"), _cron("bad", "61 * * * *"))


def _cron(name: str, expr: str) -> Schedule:
    return Schedule(name=name, entrypoint="time_jobs:stamp", cron=expr)


# -- the watcher's sweeps on a skipping clock -----------------------------------------------


def test_watchers_create_each_due_slot_once_across_restarts_and_downtime(
    afk_store: afk.Store, afk_clock: SkippingClock, tmp_path: Path
) -> None:
    afk_clock.set(1000 * HOUR + 5)
    out = tmp_path / "out"
    for name, catchup in (("hourly", "latest"), ("every", "all"), ("fresh", "skip")):
        write_schedule(afk_store, every(name, HOUR, out, catchup=catchup, created=afk_clock.time()))
    first, second = Watcher(afk_store), Watcher(afk_store)

    first.sweep()
    second.sweep()  # a second watcher (or a restarted one) at the same time
    assert all(scheduled(afk_store, n) == [] for n in ("hourly", "every", "fresh"))

    afk_clock.advance(HOUR)  # the 1001st hour's slot is due
    stamp = dt.datetime.fromtimestamp(1001 * HOUR, dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    assert sorted(first.sweep()) == [f"{n}--{stamp}" for n in ("every", "fresh", "hourly")]
    assert sorted(second.sweep()) == sorted(first.pending)  # same runs found, none made
    assert [e for e in second.counts if e == "scheduled"] == []
    assert first.counts["scheduled"] == 3
    # the slot's run removed (by `afk-local rm`, or gc once it completed): never made again
    afk_store.delete(f"hourly--{stamp}")
    assert Watcher(afk_store).sweep() == sorted(first.pending)[:2]  # every, fresh: still there
    assert scheduled(afk_store, "hourly") == []

    afk_clock.advance(5 * HOUR + 600)  # the machine was off for five hours
    Watcher(afk_store).sweep()  # after the reboot
    assert len(scheduled(afk_store, "hourly")) == 1  # latest: only the newest missed one
    assert len(scheduled(afk_store, "every")) == 6  # all: every missed slot
    assert len(scheduled(afk_store, "fresh")) == 1  # skip: 10 min late is too late
    for rid in scheduled(afk_store, "every"):
        meta = afk_store.read_meta(rid)
        assert meta.status is RunStatus.CREATED and meta.entrypoint == "time_jobs:stamp"
        assert meta.params == {"args": [str(out)], "kwargs": {}}


def test_a_schedule_file_that_is_malformed_or_not_yours_is_refused(
    afk_store: afk.Store, afk_clock: SkippingClock, tmp_path: Path
) -> None:
    created = afk_clock.time() - 120
    write_schedule(afk_store, every("ok", 60, tmp_path / "o", catchup="latest", created=created))
    bad = afk_store.root / "schedules" / "evil.json"
    bad.write_text('{"name": "evil", "entrypoint": "os:system", "every_s": 1, "extra": 1}')
    os.chmod(bad, 0o600)
    foreign = write_schedule(
        afk_store, every("foreign", 60, tmp_path / "f", catchup="latest", created=created)
    )
    if os.geteuid() == 0:
        os.chown(foreign, 12345, -1)
    else:
        foreign.unlink()
    problems = {p.name: s for p, s in list_schedules(afk_store) if isinstance(s, str)}
    assert "not a schedule" in problems["evil.json"]
    if os.geteuid() == 0:
        assert "owned by uid 12345" in problems["foreign.json"]
    watcher = Watcher(afk_store)
    watcher.sweep()
    watcher.sweep()
    assert watcher.counts["rejected"] == len(problems)  # each said once
    assert scheduled(afk_store, "evil") == [] and scheduled(afk_store, "foreign") == []
    assert len(scheduled(afk_store, "ok")) == 1


# -- real processes ------------------------------------------------------------------------


def test_two_watchers_run_every_slot_of_an_every_2s_schedule_exactly_once(
    tmp_path: Path,
) -> None:
    store, out = afk.Store(tmp_path / "store"), tmp_path / "out"
    clock = ScaledClock(4.0)  # 20 s of schedule in 5 real seconds, in every process
    write_schedule(store, every("tick", 2, out, catchup="all", created=clock.time()))
    env = {**ENV, **clock.env()}
    command = [sys.executable, "-m", "afk_local", "watch", "--root", str(store.root), "--json"]
    flags = ["--interval", "0.2", "--concurrency", "8"]
    with (
        JsonLinesChild([*command, *flags], env) as one,
        JsonLinesChild([*command, *flags], env) as two,
    ):
        one.wait_for(lambda: len(scheduled(store, "tick")) >= 10)
        assert (
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "afk_local",
                    "schedule",
                    "rm",
                    "tick",
                    "--root",
                    str(store.root),
                ],
                env=env,
                capture_output=True,
                timeout=60,
            ).returncode
            == 0
        )
        runs = scheduled(store, "tick")
        one.wait_for(
            lambda: all(
                store.read_meta(r).status is RunStatus.COMPLETED for r in scheduled(store, "tick")
            )
        )
        assert one.stop() == 0 and two.stop() == 0
    runs = scheduled(store, "tick")
    slots = [Schedule(name="tick", entrypoint="m:f", every_s=2).slot_of(r) for r in runs]
    assert slots == [slots[0] + 2 * i for i in range(len(slots))]  # no slot missed
    ran = Counter(line.split()[0] for line in out.read_text().splitlines())
    assert sorted(ran) == runs and set(ran.values()) == {1}  # each slot's job ran once
    made = [e["run_id"] for w in (one, two) for e in w.events if e["event"] == "scheduled"]
    assert sorted(made) == runs  # each run was created by exactly one of the two watchers


def test_after_a_reboot_a_parked_run_and_a_due_schedule_both_run_once(tmp_path: Path) -> None:
    store, out = afk.Store(tmp_path / "store"), tmp_path / "out"
    with pytest.raises(afk.RunSleeping) as parked:
        time_jobs.sleeper.with_store(store).run(0.5, 0.1, run_id="nap")
    write_schedule(
        store, every("daily", 86400, out, catchup="latest", created=time.time() - 3 * 86400)
    )
    # what the previous boot left: the parked run's owner from another boot id
    import msgspec  # noqa: PLC0415

    from afk_local.storage import fsio  # noqa: PLC0415
    from afk_local.storage.format import codec  # noqa: PLC0415

    old_boot = OwnerInfo(pid=999_999, hostname="laptop", boot_id="0" * 32, process_start=1)
    meta = msgspec.structs.replace(store.read_meta("nap"), owner=old_boot)
    fsio.atomic_write(store.paths("nap").meta, codec.encode_meta(store.codec, meta))
    while time.time() * 1000 < parked.value.wake_at_ms:  # until the nap is due
        time.sleep(0.05)

    events = []
    for _ in range(2):  # the first watcher after the reboot, then a restarted one
        res = proc.python(
            ["-m", "afk_local", "watch", "--once", "--root", str(store.root), "--json"],
            env=ENV,
            timeout=120,
        )
        assert res.returncode == 0, res.stderr
        events += [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]

    (daily,) = scheduled(store, "daily")
    completed = sorted(e["run_id"] for e in events if e["event"] == "completed")
    assert completed == sorted([daily, "nap"])  # both ran, once
    assert store.read_meta("nap").status is RunStatus.COMPLETED
    assert [line.split()[0] for line in out.read_text().splitlines()] == [daily]  # ran once


def test_schedule_add_list_rm_on_the_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One real ``afk-local schedule`` process per subcommand; the refusals run in-process."""
    root = tmp_path / "store"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the command puts its cwd on it

    def cli(*args: str, real: bool = False) -> subprocess.CompletedProcess[str]:
        argv = ["schedule", *args, "--root", str(root)]
        if not real:
            return run_cli(argv)
        return proc.python(["-m", "afk_local", *argv], env=ENV, timeout=60, cwd=tmp_path)

    added = cli("add", "tick", "time_jobs:stamp", '["out"]', "--every", "15m", "--json", real=True)
    assert added.returncode == 0, added.stderr
    assert json.loads(added.stdout)["every_s"] == 900
    assert json.loads(added.stdout)["overlap"] == "allow"
    queued = cli("add", "q", "time_jobs:stamp", "--every", "1h", "--overlap", "queue", "--json")
    assert json.loads(queued.stdout)["overlap"] == "queue", queued.stderr
    assert cli("add", "q2", "time_jobs:stamp", "--every", "1h", "--overlap", "no").returncode == 2
    assert cli("rm", "q").returncode == 0
    typo = cli("add", "typo", "time_jobs:nope", "--every", "1h")
    assert typo.returncode == 2
    [line] = typo.stderr.splitlines()  # about the schedule: no run exists to resume or cancel
    assert line.startswith("afk-local: schedule typo not added: 'time_jobs:nope' cannot be ")
    assert "cancel" not in line and "resume" not in line
    assert cli("add", "t2", "time_jobs:stamp", "--every", "1.5s").returncode == 2
    pytest.importorskip("cronsim", reason="--cron needs the schedule extra (cronsim)")
    bad = cli("add", "c", "time_jobs:stamp", "--cron", "61 * * * *")
    assert bad.returncode == 2 and "cron" in bad.stderr
    listed = json.loads(cli("list", "--json", real=True).stdout)
    assert [(s["name"], s["every_s"], s["catchup"]) for s in listed] == [("tick", 900, "latest")]
    assert cli("rm", "tick", real=True).returncode == 0
    gone = cli("rm", "tick")
    assert gone.returncode == 2 and "no schedule" in gone.stderr
    assert json.loads(cli("list", "--json").stdout) == []
