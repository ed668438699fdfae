"""Answers bound to a pause (afk_local/runner/run/answers.py): applied only where the run waits."""

from __future__ import annotations

from pathlib import Path

import pytest
import watcher_jobs

import afk_local as afk
from afk_local.watcher.requests import resume_request


def test_an_answer_bound_to_a_pause_answers_no_other(tmp_path: Path) -> None:
    store = afk.Store(tmp_path / "s")
    out = tmp_path / "charges.txt"
    job = watcher_jobs.two_approvals.with_store(store)
    with pytest.raises(afk.RunPaused):
        job.run(str(out), run_id="pay")
    first = store.read_meta("pay").pause
    assert first is not None
    with pytest.raises(afk.RunPaused):
        afk.resume("pay", store=store, input="yes", pause_seq=first.seq)
    second = store.read_meta("pay").pause
    assert second is not None and second.seq > first.seq
    # the same answer again: pause 1 is gone, and it must not approve pause 2
    with pytest.raises(afk.PauseMismatchError, match=f"checkpoint {first.seq}"):
        afk.resume("pay", store=store, input="yes", pause_seq=first.seq)
    assert store.read_meta("pay").pause == second
    assert out.read_text().splitlines() == ["charged 1"]
    assert afk.resume("pay", store=store, input="no", pause_seq=second.seq) == ["yes", "no"]
    with pytest.raises(afk.PauseMismatchError, match="completed"):
        afk.resume("pay", store=store, input="yes", pause_seq=second.seq)


def test_a_watcher_answer_needs_a_pause_to_answer(tmp_path: Path) -> None:
    store = afk.Store(tmp_path / "s")
    with store.create("r", entrypoint="watcher_jobs:two_approvals") as run:
        run.checkpoint("runtime_state", {}, step=1)
    with pytest.raises(afk.PauseMismatchError, match="running"):
        resume_request(store, "r", "yes", has_input=True)
    assert not store.requests_dir.exists() or not list(store.requests_dir.iterdir())
