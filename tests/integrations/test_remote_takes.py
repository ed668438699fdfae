"""Takes of a run whose owner is alive, or dies at the worst moment: real processes.

The meta window (a job that finishes while an upload batch is in flight, killed right
after that batch), a take while a ``sync_effects`` owner runs or is SIGSTOPped (against
moto, and behind a 20 ms latency proxy with ``--torture``), a live background owner
refused unless ``--force``, and a lease that lapses under SIGSTOP.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest
from proc import SUPPORT, spawn
from remote_helpers import afk_cli, one_line
from remote_jobs import effects_job

import afk_local as afk

remote = pytest.importorskip("afk_local.integrations.remote")

from afk_local.integrations.remote.layout import lease_key  # noqa: E402
from afk_local.storage.rundir.mirror import FENCED_NAME  # noqa: E402


@pytest.fixture(params=["file", "s3"])
def any_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "file":
        return remote.file_url(tmp_path / "bucket")
    return request.getfixturevalue("remote_url")


# -- the meta window ------------------------------------------------------------------

META_WINDOW_CHILD = """
import os, sys, threading, time
import afk_local as afk
from afk_local.integrations.remote import Bucket, RemoteMirror

root, url = sys.argv[1:3]
holding, go_on, entered, finished = (threading.Event() for _ in range(4))

class GatedBucket(Bucket):
    # The upload of checkpoint 3 waits until checkpoint 4 and a meta change are
    # notified (so the next batch holds both); that batch's upload of checkpoint 4
    # waits until the job has finished; after it, the next checkpoint or journal
    # upload hangs (the parent kills the process there).
    passed = False
    def create(self, key, data):
        if key.endswith("000000000003.runtime_state.ckpt"):
            holding.set()
            go_on.wait(60)
        elif key.endswith("000000000004.runtime_state.ckpt"):
            entered.set()
            finished.wait(60)
            self.passed = True
        elif self.passed and "/meta/" not in key:
            print("blocked", key, flush=True)
            time.sleep(600)
        return super().create(key, data)

mirror = RemoteMirror(url, root=root)
mirror.bucket = GatedBucket(url)
run = afk.Store(root, mirror=mirror).create("r")
for i in range(1, 3):
    run.checkpoint("runtime_state", {"i": i}, step=i)
run.flush_mirror(60)
run.checkpoint("runtime_state", {"i": 3}, step=3)
holding.wait(60)
run.checkpoint("runtime_state", {"i": 4}, step=4)
run.update_meta(extra={"progress": 4})
go_on.set()
entered.wait(60)
run.finish({"total": 10}, step=5)  # the job ends while the batch uploads checkpoint 4
finished.set()
time.sleep(600)
"""


def test_a_job_finishing_during_an_upload_batch_never_reaches_the_remote_as_completed_early(
    tmp_path: Path, any_url: str
) -> None:
    child = spawn(META_WINDOW_CHILD, str(tmp_path / "a"), any_url)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().startswith("blocked")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    b = afk.Store(tmp_path / "b")
    remote.take_run(b, "r", any_url, force=True)  # the killed owner's renewal is fresh
    copy = b.open("r")
    state = copy.resume_state()
    if copy.meta.status is afk.RunStatus.COMPLETED:
        assert state.result == {"total": 10}, "completed with a wrong result"
    else:
        assert copy.latest().payload == {"i": 4}
    assert copy.verify().ok


# -- taking a live owner ------------------------------------------------------------------

LIVE_CHILD = """
import sys, time
import afk_local as afk
from afk_local.integrations.remote import RemoteMirror
root, url, sync, lease_s = sys.argv[1:5]
mirror = RemoteMirror(url, root=root, sync_effects=sync == "1", lease_s=float(lease_s))
run = afk.Store(root, mirror=mirror).create("live")
run.checkpoint("runtime_state", {"i": 0}, step=0)
run.flush_mirror(60)
print("running", flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("sync", [False, True])
def test_a_live_owner_is_taken_only_with_sync_effects_or_force(tmp_path: Path, sync: bool) -> None:
    url = remote.file_url(tmp_path / "bucket")
    child = spawn(LIVE_CHILD, str(tmp_path / "a"), url, "1" if sync else "0", "30")
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "running"
        b = tmp_path / "b"
        if sync:  # every intent is fenced one by one: the take goes ahead
            taken = afk_cli(b, "pull", "live", "--from", url, "--take", "--json")
            assert '"took": true' in taken.stdout and '"owner_renewed_ms"' in taken.stdout
        else:
            refused = afk_cli(b, "pull", "live", "--from", url, "--take", code=2)
            line = one_line(refused.stderr)
            assert "renewed its lease" in line and "--force" in line
            assert not remote.Bucket(url).exists(lease_key("live", 2)), "nothing moved"
            afk_cli(b, "pull", "live", "--from", url, "--take", "--force")
        assert remote.Bucket(url).exists(lease_key("live", 2))
    finally:
        child.kill()
        child.wait()


def test_a_lapsed_lease_is_taken_without_force(tmp_path: Path) -> None:
    url = remote.file_url(tmp_path / "bucket")
    child = spawn(LIVE_CHILD, str(tmp_path / "a"), url, "0", "0.3")
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "running"
        child.send_signal(signal.SIGSTOP)  # alive, but no longer renewing
        b = afk.Store(tmp_path / "b")
        deadline = 0
        while True:  # a liveness wait for the lapse, not a timing claim
            try:
                report = remote.take_run(b, "live", url)
                break
            except afk.MirrorError as exc:
                assert "renewed its lease" in str(exc)
                deadline += 1
                assert deadline < 600, "the lease never lapsed"
                threading.Event().wait(0.05)
        assert report.took and report.owner_renewed_ms is not None
        child.send_signal(signal.SIGCONT)
    finally:
        child.kill()
        child.wait()


# -- a take while the owner runs with sync_effects ---------------------------------------

SYNC_JOB_CHILD = """
import sys
import afk_local as afk
from afk_local.integrations.remote import RemoteMirror
from remote_jobs import effects_job
root, url, out, n = sys.argv[1:5]
store = afk.Store(root, mirror=RemoteMirror(url, root=root, sync_effects=True))
try:
    effects_job.with_store(store).run(out, int(n), run_id="job")
except afk.LeaseLostError as exc:
    print("fenced", str(exc).count(chr(10)), flush=True)
"""

SYNC_N = 60


@pytest.mark.parametrize("pause", [False, True], ids=["running", "sigstop"])
@pytest.mark.parametrize("network", ["remote_url", "slow_remote_url"], ids=["moto", "moto+20ms"])
def test_a_take_while_a_sync_effects_owner_runs_repeats_no_effect(
    tmp_path: Path, request: pytest.FixtureRequest, network: str, pause: bool
) -> None:
    if network == "slow_remote_url" and not request.config.getoption("--torture"):
        pytest.skip("the 20 ms latency variant runs with --torture")
    remote_url = request.getfixturevalue(network)
    a, b, out = tmp_path / "a", tmp_path / "b", tmp_path / "calls"
    env = {"PYTHONPATH": str(SUPPORT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    child = spawn(SYNC_JOB_CHILD, str(a), remote_url, str(out), str(SYNC_N), env=env)
    try:
        assert child.stdout is not None
        for _ in range(3):  # the owner is well into the run
            assert child.stdout.readline().startswith("done")
        if pause:
            child.send_signal(signal.SIGSTOP)
        taken = afk_cli(b, "pull", "job", "--from", remote_url, "--take")
        assert "taken" in taken.stdout
        if pause:
            child.send_signal(signal.SIGCONT)
        rest, _ = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    # The owner stopped at its next intent: its check after the upload saw epoch 2.
    assert rest.splitlines()[-1] == "fenced 0", rest
    assert (a / "runs" / "job" / FENCED_NAME).exists()
    store_b = afk.Store(b)  # B's own uploads play no part in what ran where
    try:
        total = effects_job.with_store(store_b).run(str(out), SYNC_N, run_id="job")
    except afk.EffectInDoubtError as exc:
        # The intent the owner uploaded just before it saw the new lease: B reports it
        # in doubt (it did not run) and never runs it on its own.
        assert "\n" not in str(exc)
        total = None
    counts: dict[int, int] = {}
    for line in out.read_text().split():
        counts[int(line)] = counts.get(int(line), 0) + 1
    assert all(n == 1 for n in counts.values()), f"duplicated effects: {counts}"
    if total is not None:
        assert sorted(counts) == list(range(SYNC_N))
        assert total == sum(i * i for i in range(SYNC_N))
