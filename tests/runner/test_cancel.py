"""Cancelling a run (afk_local/runner/operations/cancel.py): decided under the run's lock,
never racing completion."""

from __future__ import annotations

import time
from pathlib import Path

import proc
from proc import SUPPORT

import afk_local as afk
from afk_local.runner.operations.settle import settle

ENV = {"PYTHONPATH": str(SUPPORT)}

OWNER = """
import sys, runner_jobs
print(runner_jobs.gated.with_store(sys.argv[1]).run(sys.argv[3], run_id=sys.argv[2]), flush=True)
"""

# Waits up to 30 s for the run's lock, as `Store(lock_timeout=...)` lets any caller do.
CANCEL = """
import sys, afk_local as afk
store = afk.Store(sys.argv[1], lock_timeout=30)
print("cancelling", flush=True)
try:
    afk.cancel(sys.argv[2], store=store, reason="too late")
    print("cancelled", flush=True)
except Exception as exc:
    print("refused", type(exc).__name__, exc, flush=True)
"""


def test_cancel_waiting_for_the_lock_never_cancels_a_run_that_completed(
    tmp_path: Path, trials
) -> None:
    """The owner completes while cancel waits for its lock: cancel must see that, under the lock."""
    root = tmp_path / "store"
    for trial in range(trials(2, 20)):
        run_id, gate = f"race-{trial}", tmp_path / f"gate-{trial}"
        owner = proc.spawn(OWNER, str(root), run_id, str(gate), env=ENV)
        try:
            assert owner.stdout is not None
            assert owner.stdout.readline().strip() == "waiting"  # running, lock held
            canceller = proc.spawn(CANCEL, str(root), run_id, env=ENV)
            assert canceller.stdout is not None
            assert canceller.stdout.readline().strip() == "cancelling"
            time.sleep(0.5)  # let cancel read the status (running) and wait for the lock
            gate.touch()
            out, err = owner.communicate(timeout=60)
            assert owner.returncode == 0 and out.strip() == "opened", err
            said, err = canceller.communicate(timeout=60)
        finally:
            for child in (owner, canceller):
                if child.poll() is None:
                    child.kill()
                    child.wait()
        store = afk.Store(root)
        assert store.read_meta(run_id).status is afk.RunStatus.COMPLETED, (said, err)
        assert store.open(run_id).resume_state().result == "opened"
        assert said.startswith("refused"), (said, err)


def test_cancel_and_settle_are_not_attempts_of_the_run(tmp_path: Path) -> None:
    store = afk.Store(tmp_path)
    with store.create("r") as run:
        run.effects.record_intent(
            "charge", step=1, name="charge", input_hash="h", idempotency_key="k"
        )
    assert store.read_meta("r").attempt == 1
    settle("r", "charge", store=store, done=True, result=None)
    assert store.read_meta("r").attempt == 1
    afk.cancel("r", store=store)
    meta = store.read_meta("r")
    assert meta.status is afk.RunStatus.CANCELLED
    assert meta.attempt == 1
    with store.resume_writer("r") as run:  # a real attempt still counts
        pass
    assert store.read_meta("r").attempt == 2
