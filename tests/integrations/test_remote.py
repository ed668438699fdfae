"""The remote mirror against a real S3 API (moto's server, or AFK_LOCAL_TEST_S3_URL).

Crashes are real SIGKILLs of child processes; moving a run between stores goes through
the ``afk-local`` command line in real processes, as a person would do it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from proc import SUPPORT, kill_after, spawn
from remote_helpers import afk_cli
from remote_jobs import effects_job

import afk_local as afk

remote = pytest.importorskip("afk_local.integrations.remote")

from afk_local.integrations.remote.remote_run import read_remote_run  # noqa: E402

N = 8
STALL = 5


JOB_CHILD = """
import sys
import afk_local as afk
from remote_jobs import effects_job
root, mirror, run_id, out, n = sys.argv[1:6]
store = afk.Store(root, mirror=mirror or "")
print("result", effects_job.with_store(store).run(out, int(n), run_id=run_id), flush=True)
"""


def start_job(root: Path, out: Path, *, mirror: str = "", stall: int | None = None):
    env = {"PYTHONPATH": str(SUPPORT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    if stall is not None:
        env["REMOTE_JOB_STALL_AT"] = str(stall)
    return spawn(JOB_CHILD, str(root), mirror, "job", str(out), str(N), env=env)


def calls(out: Path) -> list[int]:
    return [int(line) for line in out.read_text().split()]


def wait_for(predicate, what: str, timeout: float = 60.0):
    """Poll until ``predicate()`` is truthy (a liveness wait, not a timing claim)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"gave up waiting for {what}")


def test_a_killed_run_pushed_then_taken_elsewhere_resumes_with_each_effect_once(
    tmp_path: Path, remote_url: str
) -> None:
    a, b, out = tmp_path / "a", tmp_path / "b", tmp_path / "calls"
    killed = kill_after(start_job(a, out, stall=STALL), acks=STALL + 1)
    assert killed.lines[-1] == f"stalled {STALL}", killed
    assert calls(out) == list(range(STALL + 1))

    pushed = afk_cli(a, "push", "--to", remote_url)
    assert "job: pushed" in pushed.stdout
    assert "up to date" in afk_cli(a, "push", "job", "--to", remote_url).stdout  # idempotent
    taken = afk_cli(b, "pull", "job", "--from", remote_url, "--take")
    assert "taken" in taken.stdout and "epoch 2" in taken.stdout

    resumed = afk_cli(b, "resume", "job")
    assert calls(out) == list(range(N)), "every effect ran exactly once over both stores"
    assert str(sum(i * i for i in range(N))) in resumed.stdout
    assert afk.Store(b).read_meta("job").status is afk.RunStatus.COMPLETED
    assert afk.Store(b).open("job").verify().ok
    # The first store is fenced: its copy may not be pushed over the new holder's.
    refused = afk_cli(a, "push", "job", "--to", remote_url, code=1)
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "lease" in lines[0], refused.stderr


def test_the_mirror_keeps_up_during_a_run_and_a_killed_owner_is_taken_over(
    tmp_path: Path, remote_url: str
) -> None:
    a, b, out = tmp_path / "a", tmp_path / "b", tmp_path / "calls"
    child = start_job(a, out, mirror=remote_url, stall=STALL)
    bucket = remote.Bucket(remote_url)
    try:
        assert child.stdout is not None
        lines = [child.stdout.readline().strip() for _ in range(STALL + 1)]
        assert lines[-1] == f"stalled {STALL}", lines
        # The job is blocked inside item STALL and nothing flushed its writer: the
        # background mirror alone brings the remote up to what is acknowledged locally.
        local = afk.Store(a).open("job")
        journal = a / "runs" / "job" / "effects.log"
        expected = (local.latest().seq, journal.stat().st_size)
        wait_for(lambda: remote_run_state(bucket) == expected, "the mirror to catch up")
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -9

    # The killed owner renewed its lease moments ago and mirrored effects in the
    # background: a plain take is refused (one line) until the lease lapses.
    refused = afk_cli(b, "pull", "job", "--from", remote_url, "--take", code=2)
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "--force" in refused.stderr and "renewed its lease" in refused.stderr
    taken = afk_cli(b, "pull", "job", "--from", remote_url, "--take", "--force")
    assert "in doubt" in taken.stdout and "last written" in taken.stdout
    store_b = afk.Store(b, mirror=remote_url)
    job = effects_job.with_store(store_b)
    assert job.run(str(out), N, run_id="job") == sum(i * i for i in range(N))
    assert calls(out) == list(range(N))
    # b's mirror uploaded the rest under epoch 2: a third store sees the finished run.
    c = afk.Store(tmp_path / "c")
    remote.pull_run(c, remote_url, "job")
    assert c.open("job").resume_state().result == sum(i * i for i in range(N))


def remote_run_state(bucket) -> tuple[int, int] | None:
    try:
        run = read_remote_run(bucket, "job")
        snap = run.snapshot() if run is not None else None
    except afk.MirrorError:
        return None  # no run.meta yet
    return None if snap is None else (snap.head_seq, snap.journal_end)


FENCED_CHILD = """
import os, sys, time
import afk_local as afk
root, mirror, go = sys.argv[1:4]
store = afk.Store(root, mirror=mirror)
run = store.create("fenced")
seq = 0
try:
    while True:
        seq = run.checkpoint("runtime_state", {"i": seq}, step=seq).seq
        run.flush_mirror(60)
        print("ack", seq, flush=True)
        while not os.path.exists(go + str(seq)):
            time.sleep(0.02)
except afk.LeaseLostError as exc:
    print("lost", type(exc).__name__, flush=True)
for attempt in ("checkpoint", "effect"):
    try:
        if attempt == "checkpoint":
            run.checkpoint("runtime_state", {"i": -1}, step=seq)
        else:
            run.effects.record_intent("k", name="charge", input_hash="h", idempotency_key="i")
        print("accepted", attempt, flush=True)
    except afk.LeaseLostError as exc:
        print("refused", attempt, "lease" in str(exc), flush=True)
try:
    run.close()
except afk.AfkLocalError as exc:
    print("close", type(exc).__name__, flush=True)
print("exit", flush=True)
"""


def test_the_old_owner_is_fenced_once_another_store_takes_the_run(
    tmp_path: Path, remote_url: str
) -> None:
    a, b, go = tmp_path / "a", tmp_path / "b", str(tmp_path / "go-")
    child = spawn(FENCED_CHILD, str(a), remote_url, go)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().split() == ["ack", "1"]
        Path(go + "1").touch()
        assert child.stdout.readline().split() == ["ack", "2"]
        # Store b takes the run (forced: a is alive and renews its lease) while a is
        # between two checkpoints.
        with pytest.raises(afk.MirrorError, match="renewed its lease"):
            remote.take_run(afk.Store(b), "fenced", remote_url)
        assert remote.take_run(afk.Store(b), "fenced", remote_url, force=True).took
        Path(go + "2").touch()
        rest, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
    lines = rest.splitlines()
    assert lines[0] == "lost LeaseLostError", (rest, err)
    assert "refused checkpoint True" in lines and "refused effect True" in lines
    assert lines[-1] == "exit"
    # a's seq 3 landed locally but never became the run: b holds seqs 1..2 and goes on.
    store_b = afk.Store(b, mirror=remote_url)
    with store_b.resume_writer("fenced") as run:
        assert run.checkpoint("runtime_state", {"i": "b"}, step=3).seq == 3
        run.flush_mirror(60)
    c = afk.Store(tmp_path / "c")
    remote.pull_run(c, remote_url, "fenced")
    assert c.open("fenced").latest().payload == {"i": "b"}
    # a cannot continue the run either: reopening it for writing checks the lease.
    with pytest.raises(afk.LeaseLostError, match="lease"):
        afk.Store(a, mirror=remote_url).resume_writer("fenced")


PUSH_CHILD = """
import sys
from afk_local.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_killed_push_resumes_and_the_pull_is_complete(tmp_path: Path, remote_url: str) -> None:
    a, b = afk.Store(tmp_path / "a"), afk.Store(tmp_path / "b")
    total = 200
    with a.create("big") as run:
        for i in range(total):
            run.checkpoint("runtime_state", {"i": i, "pad": "x" * 200}, step=i)
    bucket = remote.Bucket(remote_url)

    def uploaded() -> int:
        return sum(1 for o in bucket.list_objects("big", limit=10_000) if o.key.endswith(".ckpt"))

    args = ("--root", str(a.root), "push", "big", "--to", remote_url, "--jobs", "1")
    push = spawn(PUSH_CHILD, *args)
    try:
        wait_for(lambda: uploaded() >= 10, "the push to start uploading")
    finally:
        push.kill()
        push.wait()
    partial = uploaded()
    assert 10 <= partial < total, "the push was killed part way"

    report = remote.push_run(a, remote_url, "big")
    assert report.files == total - partial
    assert remote.push_run(a, remote_url, "big").up_to_date
    remote.pull_run(b, remote_url, "big")
    pulled = b.open("big")
    assert [c.payload["i"] for c in pulled.history()] == list(range(total))
    assert pulled.verify().ok
