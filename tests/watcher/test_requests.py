"""Watcher requests (afk_local/watcher/requests.py): an answer names the pause it answers and
is applied at most once, across watcher crashes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import watcher_jobs
from proc import REPO, SUPPORT

from afk_local.storage.format.records import RunStatus
from afk_local.storage.store import Store
from afk_local.testing import run_and_kill
from afk_local.watcher.requests import pending_requests, resume_request

ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(
        p for p in (str(SUPPORT), str(REPO), os.environ.get("PYTHONPATH", "")) if p
    ),
}
FAST = ["--interval", "0.2", "--backoff", "0.2", "--grace", "10"]

# A watcher that dies by SIGKILL right after it acted on a request, before removing it.
DIES_BEFORE_UNLINK = """
import os, signal, sys
from afk_local.storage import fsio
def die_at_request_unlink(operation, path):
    if operation == "unlink" and os.sep + "requests" + os.sep in path:
        os.kill(os.getpid(), signal.SIGKILL)
fsio.set_io_hook(die_at_request_unlink)
from afk_local.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def _watch_once(root: Path, script: str | None = None) -> subprocess.CompletedProcess[str]:
    args = ["watch", "--root", str(root), "--json", "--once", *FAST]
    cmd = (
        [sys.executable, "-c", script, *args]
        if script
        else [sys.executable, "-m", "afk_local", *args]
    )
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=90)


def _pause_seq(store: Store, run_id: str) -> int:
    meta = store.read_meta(run_id)
    assert meta.status is RunStatus.PAUSED and meta.pause is not None, meta.status
    return meta.pause.seq


def test_an_answer_replayed_after_a_watcher_crash_never_answers_the_next_pause(
    tmp_path: Path,
) -> None:
    root, out = tmp_path / "store", tmp_path / "charges.txt"
    store = Store(root)
    first = run_and_kill(watcher_jobs.two_approvals, str(out), at=None, store=store, run_id="pay")
    assert first.paused, first.stderr
    first_pause = _pause_seq(store, "pay")
    resume_request(store, "pay", "yes", has_input=True)  # the answer to approval 1

    killed = _watch_once(root, DIES_BEFORE_UNLINK)
    assert killed.returncode == -9, killed.stderr
    assert len(pending_requests(store)) == 1  # acted on, never removed
    deadline = time.monotonic() + 60  # its child (own session) answers approval 1 and pauses again
    while (
        store.read_meta("pay").status is not RunStatus.PAUSED
        or _pause_seq(store, "pay") == first_pause
    ):
        assert time.monotonic() < deadline, store.read_meta("pay")
        time.sleep(0.05)
    second_pause = _pause_seq(store, "pay")
    assert out.read_text().splitlines() == ["charged 1"]

    again = _watch_once(root)  # the next watcher finds the leftover request
    assert "Traceback" not in again.stderr, again.stderr

    assert out.read_text().splitlines() == ["charged 1"]  # approval 2 was never given
    assert _pause_seq(store, "pay") == second_pause
    assert pending_requests(store) == []


def test_two_watchers_handling_one_answer_apply_it_once(tmp_path: Path, trials) -> None:
    """Both read the request; the run's lock and the pause check let one child apply it."""
    for trial in range(trials(1, 10)):
        root, out = tmp_path / f"store-{trial}", tmp_path / f"charges-{trial}.txt"
        store = Store(root)
        first = run_and_kill(
            watcher_jobs.two_approvals, str(out), at=None, store=store, run_id="pay"
        )
        assert first.paused, first.stderr
        first_pause = _pause_seq(store, "pay")
        resume_request(store, "pay", "yes", has_input=True)
        args = ["watch", "--root", str(root), "--json", "--once", *FAST]
        watchers = [
            subprocess.Popen(
                [sys.executable, "-m", "afk_local", *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=ENV,
            )
            for _ in range(2)
        ]
        for watcher in watchers:
            _, err = watcher.communicate(timeout=90)
            assert "Traceback" not in err, err
        assert out.read_text().splitlines() == ["charged 1"], trial  # once, never approval 2
        assert _pause_seq(store, "pay") > first_pause, trial
        assert pending_requests(store) == []
