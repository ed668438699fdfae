"""A run made for another process to start (a schedule's slot, ``afk-local submit``,
``afk-local restart``) is not started yet, not interrupted: its first start is attempt 1.

From a user's side: a project directory with a job module, the commands as a person types
them (``python -m afk_local``, cwd the project), their output read as text.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from proc import REPO

from afk_local.cli import main

JOBS = """
import afk_local as afk

@afk.durable
def report(ctx, region):
    return ctx.step("work", lambda: f"report {region}")
"""


@pytest.fixture
def afk_local(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[..., tuple[int, str, str]]:
    """``afk-local ARGS`` as typed in the project directory (in this process, for speed):
    (exit code, stdout, stderr). The watcher's children are real processes."""
    (tmp_path / "first_start_jobs.py").write_text(JOBS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delenv("AFK_LOCAL_ROOT", raising=False)
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the afk_local under test, in children too

    def run(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


def status_cells(listing: str, run_id: str) -> list[str]:
    """The STATUS, OWNER and ATTEMPTS cells of ``run_id``'s row in ``afk-local runs``."""
    header, *rows = listing.splitlines()
    (row,) = [r for r in rows if r.startswith(run_id + " ")]
    columns = (("STATUS", "OWNER"), ("OWNER", "STEP"), ("ATTEMPTS", "ETA"))
    return [row[header.index(a) : header.index(b)].strip() for a, b in columns]


def test_a_scheduled_run_starts_as_attempt_1_not_as_a_resume(
    afk_local: Callable[..., tuple[int, str, str]], tmp_path: Path
) -> None:
    code, _, err = afk_local(
        "schedule", "add", "nightly", "first_start_jobs:report", '["eu"]', "--every", "1s"
    )
    assert code == 0, err
    time.sleep(1.1)  # the schedule's first slot (slots at or after its creation count)
    code, watched, err = afk_local("watch", "--once", "--json")
    assert code == 0, err
    events = [json.loads(line) for line in watched.splitlines()]
    (run_id,) = {e["run_id"] for e in events if e["event"] == "scheduled"}
    kinds = [e["event"] for e in events if e["run_id"] == run_id]
    assert kinds == ["scheduled", "started", "completed"], events
    (started,) = [e for e in events if e["event"] == "started"]
    assert started["message"].startswith("attempt 1 (pid ")
    assert started["log"].endswith("logs/attempt-1.log")
    header = (tmp_path / started["log"]).read_text().splitlines()[0]
    assert f": starting {run_id}, attempt 1," in header

    assert status_cells(afk_local("runs")[1], run_id) == ["completed", "-", "1"]


def test_a_submitted_or_restarted_run_is_listed_as_not_started(
    afk_local: Callable[..., tuple[int, str, str]],
) -> None:
    code, _, err = afk_local("submit", "first_start_jobs:report", '["us"]', "--run-id", "later")
    assert code == 0, err
    assert status_cells(afk_local("runs")[1], "later") == ["created (not started)", "-", "0"]
    shown = json.loads(afk_local("show", "later", "--json")[1])
    assert shown["next"] == (
        "not started yet: `afk-local watch` starts it (or `afk-local resume later`)"
    )

    code, out, err = afk_local("resume", "later")  # the command `show` advises
    assert (code, out) == (0, 'run later completed: "report us"\n'), err
    code, _, err = afk_local("restart", "later", "--as", "again", "--no-start")
    assert code == 0, err
    listing = afk_local("runs")[1]
    assert status_cells(listing, "later") == ["completed", "-", "1"]  # the resume was its first
    assert status_cells(listing, "again") == ["created (not started)", "-", "0"]
