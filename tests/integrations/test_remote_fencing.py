"""Fencing between two stores on one remote: real processes, SIGKILL, one-line refusals.

The fenced marker on the old owner's machine, signed leases, bases and renewals in
keyed stores, a journal with a missing segment, a take that died half way, two takes
at once, and a remote that hangs or is down when a run is opened and written.
test_remote_takes.py has the takes of a live owner and the meta window.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from proc import SUPPORT, spawn
from remote_helpers import afk_cli, make_run, one_line, overwrite

import afk_local as afk

remote = pytest.importorskip("afk_local.integrations.remote")
obstore = pytest.importorskip("obstore")

from afk_local.integrations.remote.layout import (  # noqa: E402
    alive_key,
    bases_key,
    lease_key,
    segment_key,
)
from afk_local.integrations.remote.lease import encode_lease, new_lease  # noqa: E402
from afk_local.integrations.remote.upload import RunUploader  # noqa: E402
from afk_local.storage.rundir.mirror import FENCED_NAME  # noqa: E402


@pytest.fixture(params=["file", "s3"])
def any_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "file":
        return remote.file_url(tmp_path / "bucket")
    return request.getfixturevalue("remote_url")


# -- the fenced marker ------------------------------------------------------------------

RESUME_CHILD = """
import sys
import afk_local as afk
from remote_jobs import effects_job
root, mirror, out, n = sys.argv[1:5]
store = afk.Store(root, mirror=mirror)
print("result", effects_job.with_store(store).run(out, int(n), run_id="job"), flush=True)
"""


def test_a_fenced_copy_is_never_resumed_or_written_until_taken_back(tmp_path: Path) -> None:
    url = remote.file_url(tmp_path / "bucket")
    a, b, out = tmp_path / "a", tmp_path / "b", tmp_path / "calls"
    env = {"PYTHONPATH": str(SUPPORT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    child = spawn(RESUME_CHILD, str(a), url, str(out), "6", env=env | {"REMOTE_JOB_STALL_AT": "2"})
    try:
        assert child.stdout is not None
        lines = [child.stdout.readline().strip() for _ in range(3)]
        assert lines[-1] == "stalled 2", lines
    finally:
        child.kill()
        child.wait()
    remote.take_run(afk.Store(b), "job", url, force=True)
    # a's next push sees the newer epoch: the push fails in one line and a's copy is fenced.
    refused = afk_cli(a, "push", "job", "--to", url, code=1)
    assert "lease" in one_line(refused.stderr)
    assert (a / "runs" / "job" / FENCED_NAME).exists()
    # Without the mirror set, a's copy is still refused, in one line, by resume ...
    refused = afk_cli(a, "resume", "job", code=2)
    assert "fenced" in one_line(refused.stderr)
    # ... by any writer ...
    with pytest.raises(afk.LeaseLostError, match="fenced"):
        afk.Store(a).resume_writer("job")
    # ... and the watcher skips it, saying why once, instead of resuming it.
    watched = afk_cli(a, "watch", "--once", "--json", "--interval", "0.2", "--grace", "10")
    events = [json.loads(x) for x in watched.stdout.splitlines() if x.startswith("{")]
    assert [e["event"] for e in events if e.get("run_id") == "job"] == ["skipped"], events
    assert "fenced" in next(e["message"] for e in events if e.get("run_id") == "job")
    assert [int(x) for x in out.read_text().split()] == [0, 1, 2]
    # Taken back, a's copy is the remote's again and writable.
    assert remote.take_run(afk.Store(a), "job", url).took
    assert not (a / "runs" / "job" / FENCED_NAME).exists()
    with afk.Store(a).resume_writer("job") as run:
        run.checkpoint("runtime_state", {"back": True}, step=9)


# -- signed leases and bases, journal gaps -----------------------------------------------


def test_a_forged_lease_or_bases_object_is_refused_by_a_keyed_store(
    tmp_path: Path, any_url: str
) -> None:
    key = b"k" * 32
    a, b = afk.Store(tmp_path / "a", key=key), afk.Store(tmp_path / "b", key=key)
    make_run(a, "r", 4, effects=3)
    remote.push_run(a, any_url, "r")
    # Someone without the key creates the next epoch, claiming it took nothing (bases 0):
    # a taker that believed it would run every effect again.
    forged = new_lease("r", 2, "f" * 32, meta=(a.paths("r").meta.read_bytes()))
    assert remote.Bucket(any_url).create(lease_key("r", 2), encode_lease(forged))
    with pytest.raises(remote.RemoteIntegrityError, match="refused") as caught:
        remote.take_run(b, "r", any_url)
    assert "\n" not in str(caught.value)
    # A forged bases object under a genuine signed lease is refused the same way.
    overwrite(any_url, lease_key("r", 2), None)
    c = afk.Store(tmp_path / "c", key=key)
    assert remote.take_run(c, "r", any_url, force=True).took
    overwrite(any_url, bases_key("r", 2), b'{"format":"afk-local-bases","run_id":"r"}')
    with pytest.raises(remote.RemoteIntegrityError, match="bases"):
        remote.take_run(b, "r", any_url, force=True)
    assert not b.runs_dir.exists() or list(b.runs_dir.iterdir()) == []


def test_a_forged_released_renewal_does_not_open_a_live_keyed_run_to_a_take(
    tmp_path: Path,
) -> None:
    url = remote.file_url(tmp_path / "bucket")
    key = b"k" * 32
    owner = afk.Store(tmp_path / "a", key=key, mirror=remote.RemoteMirror(url, root=tmp_path / "a"))
    with owner.create("r") as run:
        run.checkpoint("runtime_state", {"i": 1}, step=1)
        run.flush_mirror(30)
        b = afk.Store(tmp_path / "b", key=key)
        with pytest.raises(afk.MirrorError, match="renewed its lease"):
            remote.take_run(b, "r", url)  # the owner is alive and signs its renewals
        forged = (
            b'{"format":"afk-local-renewal","run_id":"r","epoch":1,"sync_effects":false,'
            b'"lease_ms":30000,"released":true}'
        )
        overwrite(url, alive_key("r", 1), forged)
        with pytest.raises(remote.RemoteIntegrityError, match="refused") as caught:
            remote.take_run(b, "r", url)
        assert "\n" not in str(caught.value)
        assert not remote.Bucket(url).exists(lease_key("r", 2)), "nothing moved"
        run.checkpoint("runtime_state", {"i": 2}, step=2)  # the owner was never fenced


@pytest.mark.parametrize("where", ["middle", "tail"])
def test_a_journal_with_a_missing_segment_is_refused_in_one_line(
    tmp_path: Path, where: str
) -> None:
    url = remote.file_url(tmp_path / "bucket")
    a, b = afk.Store(tmp_path / "a"), afk.Store(tmp_path / "b")
    make_run(a, "r", 6, effects=6)
    bucket = remote.Bucket(url)
    uploader = RunUploader(bucket, a.paths("r"), remote.store_id(a.root))
    uploader.acquire()
    uploader.scan_remote()
    log = a.paths("r").journal.read_bytes()
    third = len(log) // 3
    # Three segments, as three mirror batches would have made them.
    for start, end in ((0, third), (third, 2 * third), (2 * third, len(log))):
        assert bucket.create(segment_key("r", 1, start), log[start:end])
    for name in sorted(os.listdir(a.paths("r").dir)):
        if name.endswith(".ckpt"):
            uploader.upload_file(name)
    uploader.upload_meta(uploader.read_meta())
    overwrite(url, segment_key("r", 1, third if where == "middle" else 2 * third), None)
    refused = afk_cli(b.root, "pull", "r", "--from", url, "--take", code=1)
    assert "refused" in one_line(refused.stderr)
    assert not (b.root / "runs" / "r").exists()


# -- takes that died, takes that race ---------------------------------------------------


def test_a_take_that_died_before_its_bases_is_finished_or_taken_over(tmp_path: Path) -> None:
    url = remote.file_url(tmp_path / "bucket")
    a, b, c = (afk.Store(tmp_path / name) for name in "abc")
    make_run(a, "r", 3, effects=2)
    remote.push_run(a, url, "r")
    bucket = remote.Bucket(url)
    # b created epoch 2 and died before it recorded its bases: a is fenced all the same.
    assert bucket.create(
        lease_key("r", 2), encode_lease(new_lease("r", 2, remote.store_id(b.root)))
    )
    with pytest.raises(afk.LeaseLostError, match="superseded"):
        remote.push_run(a, url, "r")
    assert (a.paths("r").dir / FENCED_NAME).exists()
    # b's mirror uploads nothing into an epoch without bases; pull --take finishes it.
    with pytest.raises(afk.MirrorError, match="did not finish"):
        RunUploader(bucket, b.paths("r"), remote.store_id(b.root)).acquire()
    report = remote.take_run(b, "r", url)
    assert report.epoch == 2 and bucket.exists(bases_key("r", 2))
    assert b.open("r").latest().payload == {"i": 2}
    # A third store takes over from there (epoch 3), with the whole history.
    assert remote.take_run(c, "r", url).epoch == 3
    assert [e.kind for e in c.open("r").effects()] == ["intent", "outcome"] * 2


def test_a_taker_skips_an_epoch_whose_take_died(tmp_path: Path) -> None:
    url = remote.file_url(tmp_path / "bucket")
    a, c = afk.Store(tmp_path / "a"), afk.Store(tmp_path / "c")
    make_run(a, "r", 3, effects=2)
    remote.push_run(a, url, "r")
    dead = new_lease("r", 2, "d" * 32)  # a store that died mid-take, never to return
    assert remote.Bucket(url).create(lease_key("r", 2), encode_lease(dead))
    report = remote.take_run(c, "r", url)
    assert report.epoch == 3 and report.seq == 3
    assert c.open("r").latest().payload == {"i": 2} and c.open("r").verify().ok


def test_of_two_stores_taking_one_run_at_once_exactly_one_wins(tmp_path: Path) -> None:
    url = remote.file_url(tmp_path / "bucket")
    a = afk.Store(tmp_path / "a")
    make_run(a, "r", 3, effects=2)
    remote.push_run(a, url, "r")
    takers = [afk.Store(tmp_path / name) for name in ("b", "c")]
    outcomes: dict[int, object] = {}
    both_read = threading.Barrier(2, timeout=60)

    class RacingBucket(remote.Bucket):
        # Both takers have read epoch 1 as the head before either creates epoch 2.
        def create(self, key: str, data: bytes) -> bool:
            if key.endswith(".lease"):
                both_read.wait()
            return super().create(key, data)

    def take(index: int) -> None:
        try:
            outcomes[index] = remote.take_run(takers[index], "r", RacingBucket(url))
        except afk.LeaseLostError as exc:
            outcomes[index] = exc

    threads = [threading.Thread(target=take, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    won = [i for i, o in outcomes.items() if isinstance(o, remote.PullReport)]
    lost = [o for o in outcomes.values() if isinstance(o, afk.LeaseLostError)]
    assert len(won) == 1 and len(lost) == 1, outcomes
    assert "\n" not in str(lost[0])
    loser = takers[1 - won[0]]
    assert not (loser.runs_dir / "r").exists(), "the loser published nothing"
    assert sorted(remote.lease.read_leases(remote.Bucket(url), "r")) == [1, 2]


# -- a hanging remote ---------------------------------------------------------------------


@pytest.fixture
def hanging_endpoint() -> Iterator[str]:
    """An endpoint that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for conn in accepted:
            conn.close()
        server.close()


HANG_CHILD = """
import sys, time
import afk_local as afk
root, url = sys.argv[1:3]
store = afk.Store(root, mirror=url, pack_loose_limit=8)
with store.create("r") as run:
    print("opened", flush=True)
    for i in range(40):  # past the loose limit: the writer would pack
        run.checkpoint("runtime_state", {"i": i}, step=i)
    print("checkpointed", flush=True)
    time.sleep(600)
"""


@pytest.fixture
def down_endpoint() -> str:
    """An endpoint where nothing listens (connections refused)."""
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    return f"http://127.0.0.1:{port}"


@pytest.mark.parametrize("endpoint", ["hanging_endpoint", "down_endpoint"])
def test_opening_and_checkpointing_a_run_never_waits_on_a_hanging_or_down_remote(
    tmp_path: Path, request: pytest.FixtureRequest, endpoint: str
) -> None:
    env = {
        "AWS_ENDPOINT_URL": request.getfixturevalue(endpoint),
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
    }
    child = spawn(HANG_CHILD, str(tmp_path / "a"), "s3://hang/runs", env=env)
    try:
        assert child.stdout is not None
        # A liveness check with a generous bound: the request timeouts (20 s of
        # silence) and retries would keep a blocking open far longer.
        ready = threading.Timer(15, child.kill)
        ready.start()
        lines = [child.stdout.readline().strip() for _ in range(2)]
        ready.cancel()
        assert lines == ["opened", "checkpointed"], lines
        assert afk.Store(tmp_path / "a").open("r").latest().payload == {"i": 39}
    finally:
        child.kill()
        child.wait()
