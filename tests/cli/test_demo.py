"""``afk-local demo``: the first thing a new user runs must show exactly-once side effects."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import proc

from afk_local.cli.commands.demo import DEFAULT_STEPS


def test_demo_runs_and_every_side_effect_happens_once() -> None:
    result = proc.python(["-m", "afk_local", "demo"], env=dict(os.environ), timeout=120)
    assert result.returncode == 0, (result.stdout, result.stderr)
    out = result.stdout
    assert "SIGKILL" in out and "on disk after the crash" in out
    done = int(re.search(r"steps done before the crash\s+(\d+)", out).group(1))
    skipped = int(re.search(r"steps skipped on resume \(checkpointed\)\s+(\d+)", out).group(1))
    replayed = int(re.search(r"steps replayed from the journal\s+(\d+)", out).group(1))
    executed = int(re.search(r"steps executed after the crash\s+(\d+)", out).group(1))
    assert 0 < done < DEFAULT_STEPS  # the kill landed partway
    assert skipped + replayed + executed == DEFAULT_STEPS
    assert skipped + replayed >= done - 1 and skipped <= done
    n = DEFAULT_STEPS
    assert f"{n} lines, {n} distinct of {n}" in out
    assert "every side effect happened exactly once" in out
    assert re.search(r"bytes on disk\s+[\d.]+ [kM]?B in \d+ files", out)


def test_demo_with_root_keeps_its_store_there_and_refuses_a_used_directory(tmp_path) -> None:
    root = tmp_path / "demo-store"
    demo = [sys.executable, "-m", "afk_local", "demo", "--steps", "6", "--root", str(root)]
    result = subprocess.run([*demo, "--json"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, (result.stdout, result.stderr)
    report = json.loads(result.stdout)
    assert report["store"] == str(root)
    log = proc.python(
        ["-m", "afk_local", "--root", str(root), "log", report["run_id"]],
        env=dict(os.environ),
        timeout=60,
    )
    assert log.returncode == 0, log.stderr
    assert log.stdout.strip()

    before = sorted(p.name for p in root.iterdir())
    again = subprocess.run(demo, capture_output=True, text=True, timeout=60)
    assert again.returncode == 2
    assert again.stdout == ""
    assert again.stderr.count("\n") == 1 and "not a new or empty directory" in again.stderr
    assert sorted(p.name for p in root.iterdir()) == before
