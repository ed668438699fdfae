"""Listing like people expect: runs filters, rm, restart, fork --set, metrics, show of a failure.

Parsing and output go through ``afk_local.cli.main(argv)`` in-process (``--json``
parsed); ``restart`` also runs once as a real ``afk-local`` process, so the job is
found by its entrypoint the way ``afk-local resume`` finds it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import report_jobs
from proc import SUPPORT

import afk_local as afk
from afk_local.cli import main
from afk_local.storage.ops.removal import REMOVED_DIR

N = 6
AFK_LOCAL = [sys.executable, "-m", "afk_local"]


def run_cli(capsys: pytest.CaptureFixture[str], root: Path, *args: str, code: int = 0) -> str:
    capsys.readouterr()
    assert main(["--root", str(root), *args]) == code
    captured = capsys.readouterr()
    if code == 2:
        assert len(captured.err.strip().splitlines()) == 1 and not captured.out, captured
    return captured.out


def run_json(capsys: pytest.CaptureFixture[str], root: Path, *args: str, code: int = 0):
    return json.loads(run_cli(capsys, root, *args, "--json", code=code))


@pytest.fixture
def store(tmp_path: Path) -> afk.Store:
    store = afk.Store(tmp_path / "store")
    job = report_jobs.metered.with_store(store)
    job.run(N, run_id="small-1", tags={"model": "small", "team": "a"})
    job.run(N, run_id="big-1", tags={"model": "big"})
    report_jobs.FAIL_AT[:] = [3]
    with pytest.raises(ValueError):
        job.run(N, run_id="small-bad", tags={"model": "small"})
    with store.create("other", entrypoint="report_jobs:metered") as run:
        run.checkpoint("runtime_state", {"state": {}}, step=0)
    return store


def test_runs_filters(store: afk.Store, capsys: pytest.CaptureFixture[str]) -> None:
    root = store.root

    def ids(*args: str) -> list[str]:
        return sorted(r["run_id"] for r in run_json(capsys, root, "runs", *args))

    assert ids() == ["big-1", "other", "small-1", "small-bad"]
    assert ids("--tag", "model=small") == ["small-1", "small-bad"]
    assert ids("--tag", "model=small", "--tag", "team=a") == ["small-1"]
    assert ids("--tag", "team") == ["small-1"]
    assert ids("--status", "failed") == ["small-bad"]
    assert ids("--status", "interrupted") == ["other"]
    assert ids("--status", "live") == []
    assert ids("--name", "small-*") == ["small-1", "small-bad"]
    assert ids("--name", "metered") == ["big-1", "other", "small-1", "small-bad"]  # job name
    assert ids("--name", "report_jobs:*") == ids("--name", "metered")
    assert ids("--since", "1h") == ids()
    assert ids("--since", "2030-01-01") == []
    assert len(run_json(capsys, root, "runs", "--limit", "2")) == 2
    row = next(r for r in run_json(capsys, root, "runs") if r["run_id"] == "small-bad")
    assert (row["done"], row["total"], row["attempt"]) == (3, N, 1)
    assert row["tags"] == {"model": "small"} and row["active_ms"] >= 0

    table = run_cli(capsys, root, "runs", "--tag", "model=big")
    assert table.splitlines()[0].split()[:5] == ["RUN", "STATUS", "OWNER", "STEP", "PROGRESS"]
    assert "6/6 100%" in table
    assert "no runs with status live" in run_cli(capsys, root, "runs", "--status", "live")
    run_cli(capsys, root, "runs", "--since", "yesterday-ish", code=2)
    run_cli(capsys, root, "runs", "--tag", "=x", code=2)


def test_show_of_a_failed_run_points_at_where_it_failed(
    store: afk.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    facts = run_json(capsys, store.root, "show", "small-bad")
    failure = facts["failure"]
    assert failure["step_key"] == "iterate#1[3]/flaky#1"
    assert failure["type"] == "ValueError" and failure["message"] == "item 3 broke"
    assert failure["where"].startswith("report_jobs.py:") and failure["where"].endswith("_boom")
    terminal = store.open("small-bad").latest()
    assert terminal is not None and (failure["seq"], failure["step"]) == (terminal.seq, 4)
    assert facts["progress"]["done"] == 3 and facts["tags"] == {"model": "small"}
    assert facts["metrics"]["loss"]["count"] == 3
    text = run_cli(capsys, store.root, "show", "small-bad")
    assert f"seq {terminal.seq}, step 4, in step iterate#1[3]/flaky#1: ValueError" in text
    assert "3/6 50%" in text
    assert run_json(capsys, store.root, "show", "small-1")["failure"] is None


def test_metrics_command(store: afk.Store, capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_json(capsys, store.root, "metrics", "small-1")
    assert doc["summary"]["loss"]["count"] == N and doc["summary"]["item"]["max"] == N - 1
    points = [p for p in doc["points"] if p["name"] == "item"]
    assert [p["value"] for p in points] == [float(i) for i in range(N)]
    assert [p["step"] for p in points] == list(range(N))  # each item's index
    only = run_json(capsys, store.root, "metrics", "small-1", "--name", "loss")
    assert set(only["summary"]) == {"loss"}
    assert "loss" in run_cli(capsys, store.root, "metrics", "small-1")
    run_cli(capsys, store.root, "metrics", "small-1", "--name", "nope", code=2)
    assert "recorded no metrics" in run_cli(capsys, store.root, "metrics", "other")


def test_rm(store: afk.Store, capsys: pytest.CaptureFixture[str]) -> None:
    root = store.root
    run_cli(capsys, root, "rm", "small-bad", code=2)  # failed: needs --force
    run_cli(capsys, root, "rm", "big-1", "other", code=2)  # interrupted: never, all or none
    assert store.exists("big-1") and store.exists("other")
    run_cli(capsys, root, "rm", "other", "--force", code=2)  # cancel it first
    run_cli(capsys, root, "rm", "nope", code=2)

    removed = run_json(capsys, root, "rm", "big-1", "small-bad", "--force")["removed"]
    assert [r["run_id"] for r in removed] == ["big-1", "small-bad"]
    assert not store.exists("big-1") and not store.exists("small-bad")
    kept = Path(removed[0]["effects_kept_in"])
    assert kept.parent == root / REMOVED_DIR and (kept / "effects.log").is_file()
    assert len([line for line in (kept / "effects.log").read_bytes().split(b"\n")]) >= 1
    assert afk.Store(root).runs(name="big-1") == []

    gone = run_json(capsys, root, "rm", "small-1", "--with-effects")["removed"]
    assert gone == [{"run_id": "small-1", "effects_kept_in": None}]
    assert sorted(p.name.split(".")[0] for p in (root / REMOVED_DIR).iterdir()) == [
        "big-1",
        "small-bad",
    ]

    afk.cancel("other", store=store)
    assert run_json(capsys, root, "rm", "other", "--force")["removed"][0]["run_id"] == "other"


def test_rm_refuses_a_live_run(store: afk.Store, capsys: pytest.CaptureFixture[str]) -> None:
    with store.resume_writer("big-1"):
        out = run_cli(capsys, store.root, "rm", "big-1", "--force", code=2)
    assert out == "" and store.exists("big-1")


def test_fork_set_edits_the_state_before_continuing(
    store: afk.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    history = store.open("small-1").history()
    at = next(c for c in history if c.phase == "runtime_state" and c.step == 3)
    forked = run_json(
        capsys,
        store.root,
        "fork",
        "small-1",
        "--at",
        str(at.seq),
        "--as",
        "what-if",
        "--set",
        "state.total=1000",
        "--set",
        'state.note="edited"',
    )
    assert forked["run_id"] == "what-if" and forked["seq"] == at.seq + 1
    assert forked["updated"] == ["state.note", "state.total"]
    edited = store.open("what-if").latest()
    assert edited is not None and edited.payload["state"] == {"total": 1000, "note": "edited"}
    assert "metrics" not in edited.payload  # the source's points are not repeated
    assert store.open("small-1").latest().payload["terminal_result"] == 55  # type: ignore[union-attr]
    result = afk.resume("what-if", store=store)
    assert result == 1000 + sum(i * i for i in range(3, N))
    items = [p.value for p in store.open("what-if").metrics().series("item")]
    assert items == [float(i) for i in range(N)]  # 0-2 from the source, 3-5 its own

    run_cli(capsys, store.root, "fork", "small-1", "--at", str(at.seq), "--set", "nope", code=2)
    with store.create("no-state") as run:  # a checkpoint with no runtime_state at or before it
        run.checkpoint("step_started", {"state": "running", "message_count": 0}, step=0)
    run_cli(capsys, store.root, "fork", "no-state", "--at", "1", "--set", "state.x=1", code=2)
    run_cli(capsys, store.root, "fork", "small-1", "--at", str(at.seq), "--set", "a.b=1", code=2)
    assert sorted(store.run_ids()) == [
        "big-1",
        "no-state",
        "other",
        "small-1",
        "small-bad",
        "what-if",
    ]


def test_restart_runs_the_same_job_with_the_same_inputs(
    store: afk.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    created = run_json(capsys, store.root, "restart", "big-1", "--as", "again", "--no-start")
    assert created == {"run_id": "again", "status": "created", "restarted_from": "big-1"}
    meta = store.read_meta("again")
    assert meta.params == store.read_meta("big-1").params and meta.attempt == 0
    assert meta.extra["tags"] == {"model": "big"}

    env = {k: v for k, v in os.environ.items() if k != "AFK_LOCAL_ROOT"}
    env["PYTHONPATH"] = str(SUPPORT)
    done = subprocess.run(
        [*AFK_LOCAL, "--root", str(store.root), "restart", "small-1", "--as", "small-2", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "run_id": "small-2",
        "status": "completed",
        "result": sum(i * i for i in range(N)),
        "restarted_from": "small-1",
    }
    info = store.info("small-2")
    assert info.attempt == 1 and info.step == N and info.tags["model"] == "small"
    assert store.read_meta("small-2").extra["restarted_from"] == "small-1"

    assert run_json(capsys, store.root, "resume", "again")["result"] == sum(i * i for i in range(N))
    run_cli(capsys, store.root, "restart", "big-1", "--as", "again", code=2)  # taken
    with store.create("plain") as run:
        run.checkpoint("runtime_state", {}, step=0)
    run_cli(capsys, store.root, "restart", "plain", code=2)  # no entrypoint: nothing to run


def test_rm_decides_under_the_run_lock(store: afk.Store) -> None:
    # What rm checked before taking the lock may be stale by then (a resume started and
    # ended in between): the status is read again under the lock, and a refusal there
    # keeps the run and its journal whole.
    def resumed_meanwhile(meta: afk.RunMeta) -> None:
        raise afk.AfkLocalError(f"now {meta.status.value}")

    with pytest.raises(afk.AfkLocalError, match="now completed"):
        store.delete("small-1", keep_effects=True, check=resumed_meanwhile)
    assert store.exists("small-1") and store.open("small-1").verify().ok
    assert not (store.root / REMOVED_DIR).exists()
