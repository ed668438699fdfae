"""Parked runs: `runs`/`show` say when they wake, the watcher resumes them then, never before.

The "never before" is checked on a time-skipping clock (the sweep itself, at chosen
times); the real-process test parks a run on the wall clock and lets a serving
`afk-local watch` wake it, asserting on the times the run and the watcher recorded.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import time_jobs
from cli_inproc import run_cli
from proc import REPO, SUPPORT, JsonLinesChild

import afk_local as afk
from afk_local.storage.format.records import OwnerInfo, RunStatus
from afk_local.testing import SkippingClock
from afk_local.watcher.watcher import Watcher

ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(
        p for p in (str(SUPPORT), str(REPO), os.environ.get("PYTHONPATH", "")) if p
    ),
}


def cli(root: Path, *args: str) -> dict:
    """``afk-local ARGS --root ROOT --json`` in this process (its output is the point)."""
    res = run_cli([*args, "--root", str(root), "--json"])
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def park(store: afk.Store, run_id: str, seconds: float) -> int:
    """Run ``time_jobs.sleeper`` here until it parks; returns its wake-up time (ms)."""
    with pytest.raises(afk.RunSleeping) as parked:
        time_jobs.sleeper.with_store(store).run(seconds, 0.5, run_id=run_id)
    return parked.value.wake_at_ms


def test_the_sweep_wakes_a_parked_run_at_wake_at_and_never_before(
    afk_store: afk.Store, afk_clock: SkippingClock
) -> None:
    wake_at = park(afk_store, "nap", 3600.0)
    watcher = Watcher(afk_store)

    afk_clock.advance(3600 - 0.002)
    assert watcher.interrupted() == []  # 2 ms early: left alone
    afk_clock.advance(0.002)
    assert afk_store.read_meta("nap").wake_at_ms == wake_at
    assert watcher.interrupted() == ["nap"]


def test_runs_and_show_say_sleeping_with_wake_at(tmp_path: Path) -> None:
    store = afk.Store(tmp_path / "store")
    wake_at = park(store, "nap", 3600.0)

    (listed,) = cli(store.root, "runs")
    assert listed["status"] == "sleeping" and listed["wake_at_ms"] == wake_at
    assert listed["interrupted"] is False
    shown = cli(store.root, "show", "nap")
    assert shown["status"] == "sleeping" and shown["wake_at_ms"] == wake_at
    assert "afk-local watch" in shown["next"]


def test_a_parked_run_is_woken_by_watch_after_wake_at_also_after_a_reboot(
    tmp_path: Path,
) -> None:
    store = afk.Store(tmp_path / "store")
    wake_at = park(store, "nap", 2.0)
    # as a previous boot left it: the watcher needs nothing from the parked process
    meta = store.read_meta("nap")
    assert meta.status is RunStatus.SLEEPING
    old_boot = OwnerInfo(pid=999_999, hostname="laptop", boot_id="0" * 32, process_start=1)
    from afk_local.storage import fsio  # noqa: PLC0415
    from afk_local.storage.format import codec  # noqa: PLC0415
    from afk_local.storage.rundir.ownership import acquire_lock  # noqa: PLC0415

    lock = acquire_lock(store.paths("nap"), 0)
    try:
        import msgspec  # noqa: PLC0415

        old = msgspec.structs.replace(meta, owner=old_boot)
        fsio.atomic_write(store.paths("nap").meta, codec.encode_meta(store.codec, old))
    finally:
        lock.release()

    command = [sys.executable, "-m", "afk_local", "watch", "--root", str(store.root), "--json"]
    with JsonLinesChild([*command, "--interval", "0.2"], ENV) as watcher:
        watcher.wait_for(lambda: any(e["event"] == "completed" for e in watcher.events))
        assert watcher.stop() == 0
    resumed = [e for e in watcher.events if e["event"] == "resumed"]
    assert [e["run_id"] for e in resumed] == ["nap"]  # once
    assert resumed[0]["ts_ms"] >= wake_at  # never before its time
    woke = store.open("nap").resume_state().result
    assert woke >= wake_at / 1000
    assert store.read_meta("nap").status is RunStatus.COMPLETED


def test_the_test_clock_reaches_the_child_the_watcher_wakes(
    afk_store: afk.Store, afk_clock: SkippingClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/time.md's ``afk_clock.advance`` then ``Watcher.run_once()``: the run completes."""
    monkeypatch.setenv("PYTHONPATH", ENV["PYTHONPATH"])  # the child imports time_jobs
    wake_at = park(afk_store, "nap", 3600.0)
    afk_clock.advance(3601)
    watcher = Watcher(afk_store)
    assert watcher.run_once() == 0, [(e.kind, e.message) for e in watcher.events]
    assert afk_store.read_meta("nap").status is RunStatus.COMPLETED  # not parked again
    woke = afk_store.open("nap").resume_state().result
    assert woke * 1000 >= wake_at  # the child read the test's clock, past the due time
