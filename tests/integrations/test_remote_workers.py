"""Mirrored effects (sync_effects) and MirroredWorkers: fan-out with no shared filesystem.

The Dask test that kills a worker of a MirroredWorkers fan-out is in test_dask.py,
next to the cluster it shares.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

import afk_local as afk

remote = pytest.importorskip("afk_local.integrations.remote")


def _break(bucket: Path) -> None:
    """The remote becomes unusable: its directory is now a plain file.

    The background uploader may be writing into it meanwhile, and re-creates the
    directory when it finds none: move the directory aside, then rename a file into
    its place, again until the file wins.
    """
    stand_in = bucket.with_name(bucket.name + ".file")
    stand_in.write_text("not a bucket")
    for attempt in range(100):
        with contextlib.suppress(FileNotFoundError):
            os.rename(bucket, bucket.with_name(f"{bucket.name}.gone{attempt}"))
        try:
            os.rename(stand_in, bucket)
            return
        except IsADirectoryError:
            continue  # the uploader made the directory again in between
    raise AssertionError("the uploader kept re-creating the bucket directory")


@pytest.mark.parametrize("sync_effects", [True, False])
def test_with_sync_effects_no_effect_runs_unless_its_intent_is_in_the_remote(
    tmp_path: Path, sync_effects: bool
) -> None:
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    root = tmp_path / "store"
    mirror = remote.RemoteMirror(
        remote.file_url(bucket),
        root=root,
        sync_effects=sync_effects,
        close_timeout_s=5,
        retry_for_s=0.5,
    )
    store = afk.Store(root, mirror=mirror)
    ran: list[str] = []
    writer = store.create("r")
    try:
        assert writer.effects.call("one", lambda: ran.append("one") or 1) == 1
        if sync_effects:  # the intent and outcome of "one" are in the remote already
            assert any((bucket / "r" / "e000000000001" / "effects").iterdir())
        _break(bucket)
        if sync_effects:
            with pytest.raises(afk.MirrorError):
                writer.effects.call("two", lambda: ran.append("two") or 2)
            assert ran == ["one"]  # "two" never ran: its intent could not reach the remote
        else:
            # background mirroring: the effect runs on local durability alone
            assert writer.effects.call("two", lambda: ran.append("two") or 2) == 2
            assert ran == ["one", "two"]
    finally:
        if sync_effects:
            writer.close()  # the failure already surfaced in the step that could not run
        else:
            with pytest.raises(afk.MirrorError):
                writer.close()  # background mode: the mirror's failure surfaces here


def test_mirrored_workers_carry_no_key_and_take_a_run_the_remote_knows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pickle  # noqa: PLC0415 - what an engine does to a task's arguments

    bucket = tmp_path / "bucket"
    bucket.mkdir()
    url = remote.file_url(bucket)
    monkeypatch.setenv("AFK_LOCAL_KEY", "secret-key-never-pickled")
    first = remote.MirroredWorkers(url, local_root=tmp_path / "machine-a")
    assert b"secret-key-never-pickled" not in pickle.dumps(first)
    with pytest.raises(TypeError, match="never sent to workers"):
        remote.MirroredWorkers(url, key="x")

    # machine A starts the run and dies without closing it (its mirror had uploaded)
    store_a = first.open()
    first.prepare(store_a, "job-1")  # unknown to the remote: nothing to take
    writer = store_a.create("job-1")
    writer.checkpoint("runtime_state", {"state": {"done": 1}}, step=1)
    writer.flush_mirror(10)

    # machine B: prepare takes the run (lease epoch 2), so it opens here for writing
    second = remote.MirroredWorkers(url, local_root=tmp_path / "machine-b")
    store_b = second.open()
    second.prepare(store_b, "job-1")
    assert store_b.open("job-1").latest().payload == {"state": {"done": 1}}
    with store_b.resume_writer("job-1") as run_b:
        run_b.checkpoint("runtime_state", {"state": {"done": 2}}, step=2)
    # and A, fenced, may write no more
    with pytest.raises(afk.LeaseLostError):
        writer.checkpoint("runtime_state", {"state": {"done": 99}}, step=3)
        writer.flush_mirror(10)
    writer.close()  # the lease error already surfaced above; closing A raises nothing more
    assert not os.path.exists(tmp_path / "machine-b" / "runs" / "job-1" / ".tmp-pull-job-1")


def test_rerunning_a_completed_run_moves_no_lease_and_downloads_it_once(tmp_path: Path) -> None:
    from remote_jobs import effects_job  # noqa: PLC0415 - tests/support is on sys.path

    from afk_local.integrations.remote.lease import read_leases  # noqa: PLC0415

    url = remote.file_url(tmp_path / "bucket")
    out = tmp_path / "calls"
    a = remote.MirroredWorkers(url, local_root=tmp_path / "machine-a")
    b = remote.MirroredWorkers(url, local_root=tmp_path / "machine-b")
    expected = sum(i * i for i in range(3))

    def rerun(site: remote.MirroredWorkers) -> tuple[object, int]:
        store = site.open()
        site.prepare(store, "job")
        result = effects_job.with_store(store).run(str(out), 3, run_id="job")
        return result, os.stat(store.paths("job").dir).st_ino

    first, inode_a = rerun(a)
    assert first == expected
    assert rerun(a) == (expected, inode_a), "the worker's own completed copy is used as is"
    result, inode_b = rerun(b)  # another worker: a read-only copy, pulled once
    assert result == expected
    assert rerun(b) == (expected, inode_b)
    assert list(read_leases(remote.Bucket(url), "job")) == [1], "no lease moved"
    assert out.read_text().split() == ["0", "1", "2"], "no effect ran again"
