"""The remote's object protocol: create-only puts, epochs, integrity, read-only copies.

The cases that depend on S3 semantics run against the real S3 API (moto's server, or
AFK_LOCAL_TEST_S3_URL); the others also run on obstore's local-directory backend.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import afk_local as afk

remote = pytest.importorskip("afk_local.integrations.remote")
obstore = pytest.importorskip("obstore")

from afk_local.integrations.remote.layout import file_key, parse_run_key, segment_key  # noqa: E402
from afk_local.storage.rundir.mirror import open_mirror  # noqa: E402


@pytest.fixture(params=["s3", "file"])
def any_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "file":
        return remote.file_url(tmp_path / "bucket")
    return request.getfixturevalue("remote_url")


def make_run(store: afk.Store, run_id: str, n: int, *, effects: int = 0) -> None:
    with store.create(run_id) as run:
        for i in range(effects):
            run.effects.record_intent(f"k{i}", name="f", input_hash="h", idempotency_key=f"i{i}")
            run.effects.record_outcome(f"k{i}", status="ok", result=i)
        for i in range(n):
            run.checkpoint("runtime_state", {"i": i, "who": "a"}, step=i)


def overwrite(url: str, key: str, data: bytes) -> None:
    """What an attacker or a broken tool does: replace an object in place."""
    if url.startswith("file://"):
        store = obstore.store.LocalStore(url[len("file://") :])
    else:
        store = obstore.store.from_url(url)
    obstore.put(store, key, data)


def test_create_only_puts_are_honoured(any_url: str) -> None:
    bucket = remote.Bucket(any_url)
    assert bucket.create("r/lease/000000000001.lease", b"first")
    assert not bucket.create("r/lease/000000000001.lease", b"second")
    assert bucket.get("r/lease/000000000001.lease", 100) == b"first"
    with pytest.raises(afk.MirrorError, match="over the bound"):
        bucket.get("r/lease/000000000001.lease", 3)


def test_a_late_upload_of_the_old_epoch_never_blocks_or_shadows_the_new_owner(
    tmp_path: Path, remote_url: str
) -> None:
    a, b = afk.Store(tmp_path / "a"), afk.Store(tmp_path / "b")
    make_run(a, "r", 3, effects=1)
    remote.push_run(a, remote_url, "r")
    assert remote.take_run(b, "r", remote_url).epoch == 2
    # a (alive, offline) wrote seq 4 and an effect; its upload lands after the take.
    with a.resume_writer("r") as run:
        run.checkpoint("runtime_state", {"i": 3, "who": "a"}, step=3)
        run.effects.record_intent("late", name="f", input_hash="h", idempotency_key="late")
    bucket = remote.Bucket(remote_url)
    run_a = a.paths("r")
    seq4 = next(p for p in run_a.dir.iterdir() if p.name.startswith("000000000004."))
    assert bucket.create(file_key("r", 1, seq4.name), seq4.read_bytes())
    log = run_a.journal.read_bytes()
    journal_base = b.paths("r").journal.stat().st_size
    assert bucket.create(segment_key("r", 1, journal_base), log[journal_base:])

    with b.resume_writer("r") as run:
        run.checkpoint("runtime_state", {"i": 3, "who": "b"}, step=3)
    report = remote.push_run(b, remote_url, "r")  # the same seq, never blocked
    assert report.epoch == 2 and report.files == 1
    c = afk.Store(tmp_path / "c")
    remote.pull_run(c, remote_url, "r")
    assert c.open("r").latest().payload == {"i": 3, "who": "b"}
    assert [e.key for e in c.open("r").effects()] == ["k0", "k0"]
    with pytest.raises(afk.LeaseLostError, match="lease"):
        remote.push_run(a, remote_url, "r")


@pytest.mark.parametrize("damage", ["flipped-bit", "torn-journal", "other-run", "wrong-key"])
def test_a_damaged_remote_run_is_refused_and_nothing_is_published(
    tmp_path: Path, remote_url: str, damage: str
) -> None:
    key = b"k" * 32
    a = afk.Store(tmp_path / "a", key=key)
    make_run(a, "r", 4, effects=2)
    remote.push_run(a, remote_url, "r")
    names = sorted(p.name for p in a.paths("r").dir.iterdir() if p.name.endswith(".ckpt"))
    victim = file_key("r", 1, names[1])
    if damage == "flipped-bit":
        data = bytearray((a.paths("r").dir / names[1]).read_bytes())
        data[len(data) // 2] ^= 0x10
        overwrite(remote_url, victim, bytes(data))
    elif damage == "torn-journal":
        log = a.paths("r").journal.read_bytes()
        overwrite(remote_url, segment_key("r", 1, 0), log[:-3])
    elif damage == "other-run":
        make_run(a, "other", 4)
        other = sorted(p for p in a.paths("other").dir.iterdir() if p.name.endswith(".ckpt"))
        overwrite(remote_url, victim, other[1].read_bytes())
    b = afk.Store(tmp_path / "b", key=b"x" * 32 if damage == "wrong-key" else key)
    with pytest.raises(remote.RemoteIntegrityError, match="refused, nothing was published"):
        remote.pull_run(b, remote_url, "r", take=True)
    assert not b.runs_dir.exists() or list(b.runs_dir.iterdir()) == []  # no run, no temp dir
    assert remote.Bucket(remote_url).exists("r/lease/000000000001.lease")
    assert not remote.Bucket(remote_url).exists("r/lease/000000000002.lease"), "no take"


def test_a_copy_pulled_without_take_is_read_only_until_taken(tmp_path: Path) -> None:
    url = remote.file_url(tmp_path / "bucket")
    a, b = afk.Store(tmp_path / "a"), afk.Store(tmp_path / "b")
    make_run(a, "r", 2)
    remote.push_run(a, url, "r")
    copy = remote.pull_run(b, url, "r")
    assert copy.read_only and not copy.took
    assert b.open("r").latest().payload == {"i": 1, "who": "a"}
    with pytest.raises(afk.LeaseLostError, match="read-only copy"):
        b.resume_writer("r")
    [info] = remote.remote_runs(url)
    assert (info.run_id, info.epoch, info.seq) == ("r", 1, 2)
    assert info.holder == remote.store_id(a.root)
    taken = remote.take_run(b, "r", url)
    assert taken.took and taken.replaced and taken.epoch == 2
    with b.resume_writer("r") as run:
        run.checkpoint("runtime_state", {"i": 2, "who": "b"}, step=2)
    assert remote.take_run(b, "r", url).up_to_date  # the holder is ahead: nothing to take


def test_store_mirror_is_resolved_through_entry_points(tmp_path: Path) -> None:
    with pytest.raises(afk.MirrorError, match=r"afk_local\[remote\]"):
        open_mirror("nope://bucket/x", tmp_path)
    store = afk.Store(tmp_path / "s", mirror=remote.file_url(tmp_path / "bucket"))
    assert isinstance(store.mirror, remote.RemoteMirror)
    assert afk.Store(tmp_path / "s", mirror="").mirror is None
    # The command line and the core start without the extra: nothing imports obstore.
    probe = (
        "import sys, afk_local, afk_local.cli.main\n"
        "afk_local.Store('.')\n"
        "bad = [m for m in sys.modules if m.startswith(('obstore', 'afk_local.integrations'))]\n"
        "assert not bad, bad\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "AFK_LOCAL_MIRROR"}
    subprocess.run([sys.executable, "-c", probe], check=True, env=env, cwd=tmp_path)


def test_keys_read_from_a_bucket_are_parsed_strictly() -> None:
    assert parse_run_key("e000000000002/000000000007.runtime_state.ckpt") is not None
    assert parse_run_key("e000000000002/effects/0000000000000100.seg").number == 100
    for bad in (
        "e000000000002/../run.meta",
        "e000000000002/run.meta",
        "e000000000002/latest",
        "e000000000000/000000000001.run_started.ckpt",
        "e00000000000\u0662/000000000001.run_started.ckpt",
        "lease/000000000000.lease",
        "e000000000001/sub/000000000001.run_started.ckpt",
    ):
        assert parse_run_key(bad) is None, bad


def _checkpoints(store: afk.Store, run_id: str) -> dict[int, object]:
    reader = store.open(run_id)
    return {f.seq: reader.load(f).payload for f in reader.checkpoint_files()}


def test_a_packed_run_is_pushed_and_pulled_whole_and_packs_are_bounded_by_their_last_seq(
    any_url: str, tmp_path: Path
) -> None:
    a, b = afk.Store(tmp_path / "a"), afk.Store(tmp_path / "b")
    make_run(a, "r", 40, effects=2)
    a.pack(["r"])
    names = sorted(os.listdir(a.paths("r", refuse_links=True).dir))
    packs = [n for n in names if n.endswith(".pack")]
    assert packs and sum(n.endswith(".ckpt") for n in names) == 1
    pack = parse_run_key(f"e000000000001/{packs[0]}")
    assert pack is not None and pack.kind == "file" and pack.number == 39  # seqs 1..39
    expected = _checkpoints(a, "r")
    assert len(expected) == 40

    remote.push_run(a, any_url, "r")
    remote.take_run(b, "r", any_url)
    assert _checkpoints(b, "r") == expected
    assert b.open("r").verify().ok
    with b.resume_writer("r") as run:  # the taker continues after the packed history
        run.checkpoint("runtime_state", {"i": 40, "who": "b"}, step=40)
    assert b.open("r").latest().payload == {"i": 40, "who": "b"}


def test_a_mirrored_writer_packs_only_what_the_remote_holds(tmp_path: Path) -> None:
    url = remote.file_url(tmp_path / "bucket")
    a = afk.Store(tmp_path / "a", mirror=url, pack_loose_limit=8)
    with a.create("r") as run:
        for i in range(60):
            run.checkpoint("runtime_state", {"i": i, "who": "a"}, step=i)
            if i % 4 == 3:
                # An uploader that keeps up, as over a real disk's fsyncs: on tmpfs this
                # writer outruns it, and packing waits (never the checkpoint) until the
                # mirror holds what it would pack, which the assertions below rely on.
                run.flush_mirror(30)
    names = os.listdir(a.paths("r", refuse_links=True).dir)
    assert any(n.endswith(".pack") for n in names)
    assert sum(n.endswith(".ckpt") for n in names) <= 16
    b = afk.Store(tmp_path / "b")
    remote.take_run(b, "r", url)  # what the mirror uploaded, loose, is the whole run
    assert _checkpoints(b, "r") == _checkpoints(a, "r")
    assert len(_checkpoints(b, "r")) == 60 and b.open("r").verify().ok
