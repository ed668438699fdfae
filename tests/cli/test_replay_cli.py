"""``afk-local replay`` and the check a resume runs first (issue 41), with real processes.

The job (tests/support/replay_jobs.py) changes its code between attempts through
``REPLAY_CODE``, as if its file had been edited; every step function call lands in a
side file, the outside world.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import proc
from proc import SUPPORT

import afk_local as afk

ITEMS = '["a", "b", "c"]'

START = """
import sys, json, replay_jobs
print(replay_jobs.checkout.with_store(sys.argv[1]).run(json.loads(sys.argv[3]), run_id=sys.argv[2]))
"""


def env_for(tmp_path: Path, code: str, **more: str) -> dict[str, str]:
    return {
        "PYTHONPATH": str(SUPPORT),
        "REPLAY_CODE": code,
        "REPLAY_SIDE": str(tmp_path / "side.txt"),
        **more,
    }


def cli(tmp_path: Path, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return proc.afk_local_cli(env_for(tmp_path, code), "--root", str(tmp_path / "store"), *args)


def completed_run(tmp_path: Path, run_id: str = "r1") -> None:
    done = proc.run(START, str(tmp_path / "store"), run_id, ITEMS, env=env_for(tmp_path, "v1"))
    assert done.returncode == 0, done.stderr


def killed_after_two_charges(tmp_path: Path, run_id: str = "r1") -> None:
    """v1 charges a and b, then dies (SIGKILL) before c."""
    earlier = side(tmp_path)
    child = proc.spawn(
        START, str(tmp_path / "store"), run_id, ITEMS,
        env=env_for(tmp_path, "v1", REPLAY_STALL_AT="CHARGED b"),
    )  # fmt: skip
    proc.kill_at_line(child, "CHARGED b")
    assert side(tmp_path) == [*earlier, "charge a 10", "charge b 10"]


def side(tmp_path: Path) -> list[str]:
    path = tmp_path / "side.txt"
    return path.read_text("utf-8").splitlines() if path.exists() else []


def run_dir_bytes(tmp_path: Path, run_id: str = "r1") -> dict[str, str]:
    """Every entry of the run directory: name -> digest of its bytes (or link target)."""
    found = {}
    for path in sorted((tmp_path / "store" / "runs" / run_id).rglob("*")):
        if path.is_symlink():
            found[path.name] = "-> " + os.readlink(path)
        elif path.is_file():
            found[path.name] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            found[path.name] = "dir"
    return found


def test_replay_of_a_completed_run_calls_nothing_and_writes_nothing(tmp_path: Path) -> None:
    completed_run(tmp_path)
    before, outside = run_dir_bytes(tmp_path), side(tmp_path)
    done = cli(tmp_path, "v1", "replay", "r1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "reproduced, 3 of 3 journaled calls replayed" in done.stdout
    as_json = json.loads(cli(tmp_path, "v1", "replay", "r1", "--json").stdout)
    assert as_json["ok"] is True and as_json["divergence"] is None
    assert run_dir_bytes(tmp_path) == before  # nothing written to the run
    assert side(tmp_path) == outside == ["charge a 10", "charge b 10", "charge c 10"]


def test_a_renamed_step_is_named_with_its_position(tmp_path: Path) -> None:
    completed_run(tmp_path)
    before = run_dir_bytes(tmp_path)
    done = cli(tmp_path, "renamed", "replay", "r1")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "DIVERGES at call 1 (charge#1)" in done.stdout
    assert "the run recorded: charge('a', 10)" in done.stdout
    assert "the code now asks: bill('a', 10)" in done.stdout
    assert "ctx.patched" in done.stdout and "afk-local restart r1" in done.stdout
    report = json.loads(cli(tmp_path, "renamed", "replay", "r1", "--json").stdout)
    assert report["divergence"]["position"] == 1
    assert report["divergence"]["kind"] == "step"
    assert run_dir_bytes(tmp_path) == before
    assert len(side(tmp_path)) == 3  # the three charges of the first run, nothing since


def test_a_changed_argument_shows_both_renderings(tmp_path: Path) -> None:
    completed_run(tmp_path)
    done = cli(tmp_path, "argchanged", "replay", "r1")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "DIVERGES at call 1 (charge#1)" in done.stdout
    assert "the run recorded: charge('a', 10)" in done.stdout
    assert "the code now asks: charge('a', 20)" in done.stdout
    assert len(side(tmp_path)) == 3


def test_patched_v2_resumes_a_v1_run_charging_each_item_once(tmp_path: Path) -> None:
    killed_after_two_charges(tmp_path)
    assert cli(tmp_path, "v2-patched", "replay", "r1").returncode == 0
    done = cli(tmp_path, "v2-patched", "resume", "r1", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["result"] == ["receipt-a", "receipt-b", "receipt-c"]
    # a and b were past the patch point in the v1 journal: no fee; c is reached live
    assert side(tmp_path) == ["charge a 10", "charge b 10", "fee c", "charge c 10"]
    report = cli(tmp_path, "v2-patched", "replay", "r1")
    assert report.returncode == 0, report.stdout
    assert "takes the old branch of patch 'fee'" in report.stdout

    # a new run under v2 takes the fee path for every item
    fresh = proc.run(
        START, str(tmp_path / "store"), "r2", ITEMS, env=env_for(tmp_path, "v2-patched")
    )
    assert fresh.returncode == 0, fresh.stderr
    assert side(tmp_path)[4:] == ["fee a", "charge a 10", "fee b", "charge b 10", "fee c",
                                  "charge c 10"]  # fmt: skip
    assert "old branch" not in cli(tmp_path, "v2-patched", "replay", "r2").stdout


def test_a_patch_decision_never_flips_on_a_later_resume(tmp_path: Path) -> None:
    """Killed again after the live fee of c: the next resume keeps every decision."""
    killed_after_two_charges(tmp_path)
    child = proc.spawn(
        "import sys, afk_local as afk\nafk.resume(sys.argv[2], store=afk.Store(sys.argv[1]))",
        str(tmp_path / "store"), "r1",
        env=env_for(tmp_path, "v2-patched", REPLAY_STALL_AT="FEE c"),
    )  # fmt: skip
    proc.kill_at_line(child, "FEE c")
    done = cli(tmp_path, "v2-patched", "resume", "r1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert side(tmp_path) == ["charge a 10", "charge b 10", "fee c", "charge c 10"]


def test_unpatched_v2_refuses_to_resume_before_any_effect(tmp_path: Path) -> None:
    killed_after_two_charges(tmp_path)
    before = run_dir_bytes(tmp_path)
    done = cli(tmp_path, "v2", "resume", "r1")
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr  # one line
    assert "resume refused before any effect" in lines[0]
    assert "charge('a', 10)" in lines[0] and "fee('a')" in lines[0]
    assert "afk-local replay r1" in lines[0]
    assert side(tmp_path) == ["charge a 10", "charge b 10"]  # no fee, no charge
    assert run_dir_bytes(tmp_path) == before  # not even a new attempt


def test_the_watcher_refuses_the_same_resume(tmp_path: Path) -> None:
    killed_after_two_charges(tmp_path)
    cli(tmp_path, "v2", "watch", "--once")
    assert side(tmp_path) == ["charge a 10", "charge b 10"]
    run = afk.Store(tmp_path / "store").read_meta("r1")
    assert run.status is afk.RunStatus.RUNNING and run.attempt == 1  # no attempt began
    logs = list((tmp_path / "store" / "runs" / "r1" / "logs").iterdir())
    said = "".join(log.read_text("utf-8") for log in logs)
    assert "resume refused before any effect" in said and "afk-local replay r1" in said


def test_replay_all_says_which_runs_would_resume(tmp_path: Path) -> None:
    completed_run(tmp_path, "done")
    killed_after_two_charges(tmp_path, "killed")
    done = cli(tmp_path, "v2", "replay", "--all", "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    reports = {r["run_id"]: r for r in json.loads(done.stdout)["runs"]}
    assert set(reports) == {"done", "killed"}
    assert not reports["killed"]["ok"] and not reports["done"]["ok"]
    interrupted = cli(tmp_path, "v2-patched", "replay", "--status", "interrupted")
    assert interrupted.returncode == 0, interrupted.stdout + interrupted.stderr
    assert "run killed (running): reproduced" in interrupted.stdout
    assert "1 of 1 runs reproduced" in interrupted.stdout
