"""Packing runs: every checkpoint reads the same, and every reader works on packed runs."""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import cli_jobs
import pytest
from proc import kill_after, run, spawn

import afk_local as afk
from afk_local.cli.main import main as cli_main
from afk_local.errors import AfkLocalError
from afk_local.runner.writer import DurableWriter
from afk_local.storage import fsio
from afk_local.storage.format import codec
from afk_local.storage.format.layout import checkpoint_name, parse_pack_name, scan_run_files
from afk_local.storage.ops.export import export_records
from afk_local.storage.ops.retention import RetentionPolicy
from afk_local.storage.rundir.packing import pack_run
from afk_local.storage.rundir.write import pack_trigger

KEY = "packing test key"


def _payload(seq: int) -> dict[str, object]:
    return {"seq": seq, "log": [f"line {i} " * 8 for i in range(seq % 40)]}


def _write(store: afk.Store, run_id: str, count: int, *, finish: bool = False) -> None:
    """Two interleaved delta chains (step_started, runtime_state), as the agent protocol has."""
    with store.create(run_id) as run:
        while run.seq < count:
            seq = run.seq + 1
            phase = "runtime_state" if seq % 2 else "step_started"
            run.checkpoint(phase, _payload(seq), step=seq)
        if finish:
            run.finish({"done": count})


def _snapshot(reader: afk.RunReader) -> dict[int, tuple[str, object, bytes]]:
    return {
        f.seq: (f.phase, reader.load(f).payload, reader.stored_bytes(f))
        for f in reader.checkpoint_files()
    }


def _names(store: afk.Store, run_id: str) -> list[str]:
    return sorted(os.listdir(store.paths(run_id).dir))


@pytest.mark.parametrize("key", [None, KEY])
def test_pack_round_trip_every_seq_reads_the_same(tmp_path: Path, key: str | None) -> None:
    store = afk.Store(tmp_path, key=key, pack_loose_limit=None)
    _write(store, "r", 120, finish=True)
    before = _snapshot(store.open("r"))
    latest = store.open("r").latest()

    (report,) = store.pack()
    assert not report.errors
    assert report.packed_files == 120  # every checkpoint but the newest (121: run_terminal)
    assert report.files_after == 2
    names = _names(store, "r")
    assert [n for n in names if n.endswith(".ckpt")] == ["000000000121.run_terminal.ckpt"]
    assert len([n for n in names if n.endswith(".pack")]) == 1

    reader = store.open("r")
    assert _snapshot(reader) == before  # same seqs, phases, payloads, and exact file bytes
    for seq, (_, payload, _) in before.items():
        assert afk.Store(tmp_path, key=key).open("r").get(seq).payload == payload  # cold
    assert reader.latest() == latest
    assert reader.resume_state().result == {"done": 120}
    report = reader.verify()
    assert report.ok, report.problems
    assert report.checked_files == 121 + 1 + 1  # checkpoints, the pack, run.meta

    # A second pack changes nothing; a writer continues after the packed run.
    assert store.pack()[0].packed_files == 0
    with store.resume_writer("r") as run:
        run.checkpoint("runtime_state", _payload(122), step=122)
    assert store.open("r").get(122).payload == _payload(122)
    assert store.open("r").verify().ok


def test_a_live_writer_keeps_its_loose_files_bounded(tmp_path: Path) -> None:
    limit = 8
    store = afk.Store(tmp_path, pack_loose_limit=limit)
    most = 0
    with store.create("r") as run:
        for seq in range(1, 161):
            run.checkpoint("runtime_state" if seq % 3 else "post_llm", _payload(seq), step=seq)
            loose, _ = scan_run_files(run.paths.dir)
            most = max(most, len(loose))
            # the writer counts its loose files without listing them after a pack
            assert run._packing.loose == len(loose)
    loose, packs = scan_run_files(store.paths("r").dir)
    assert most <= 2 * limit
    assert 1 <= len(packs) <= 8  # merged geometrically, not one pack per batch
    reader = store.open("r")
    assert [c.payload for c in reader.history()] == [_payload(s) for s in range(1, 161)]
    assert reader.verify().ok


def _loose_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The loose checkpoint files read from disk from now on (by name)."""
    reads: list[str] = []
    real = fsio.read_bounded

    def spy(path: str | os.PathLike[str], max_bytes: int) -> bytes:
        name = os.path.basename(os.fspath(path))
        if name.endswith(".ckpt"):
            reads.append(name)
        return real(path, max_bytes)

    monkeypatch.setattr(fsio, "read_bounded", spy)
    return reads


@pytest.mark.parametrize("key", [None, KEY])
def test_a_writer_packs_its_own_files_without_reading_them_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str | None
) -> None:
    """A writer keeps the bytes it published since its last pack and packs those: the
    packs hold exactly the files it wrote, and none is read back from disk."""
    store = afk.Store(tmp_path, key=key, pack_loose_limit=8)
    reads = _loose_reads(monkeypatch)
    published: dict[int, bytes] = {}
    with store.create("r") as run:
        for seq in range(1, 61):
            run.checkpoint("runtime_state" if seq % 3 else "post_llm", _payload(seq), step=seq)
            name = checkpoint_name(seq, "runtime_state" if seq % 3 else "post_llm")
            published[seq] = (run.paths.dir / name).read_bytes()
            assert run._packing.loose == len(scan_run_files(run.paths.dir)[0])
    assert reads == []
    monkeypatch.undo()
    reader = store.open("r")
    assert any(f.pack is not None for f in reader.checkpoint_files())
    assert {f.seq: reader.stored_bytes(f) for f in reader.checkpoint_files()} == published
    assert [c.payload for c in reader.history()] == [_payload(s) for s in range(1, 61)]
    assert reader.verify().ok


def test_a_resumed_writer_reads_the_files_an_earlier_one_left_loose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the files a writer published itself come from memory: what an earlier writer
    of the run left loose is read from disk, as is everything past the kept bytes."""
    store = afk.Store(tmp_path, pack_loose_limit=8)
    with store.create("r") as run:
        for seq in range(1, 7):
            run.checkpoint("runtime_state", _payload(seq), step=seq)
    reads = _loose_reads(monkeypatch)
    monkeypatch.setattr(pack_trigger, "MAX_KEPT_FRAME_BYTES", 1)  # keeps none
    with store.resume_writer("r") as run:
        for seq in range(7, 31):
            run.checkpoint("runtime_state", _payload(seq), step=seq)
    assert checkpoint_name(1, "runtime_state") in reads
    assert checkpoint_name(8, "runtime_state") in reads
    monkeypatch.undo()
    reader = store.open("r")
    assert [c.payload for c in reader.history()] == [_payload(s) for s in range(1, 31)]
    assert reader.verify().ok


def test_files_rewritten_after_loosen_head_are_packed_as_they_are_on_disk(
    tmp_path: Path,
) -> None:
    """A writer's kept bytes are dropped once it is told its files will be rewritten
    (``loosen_head``, as the LangGraph saver's prune does): a delta rewritten as a
    keyframe under its own name must be packed as the keyframe, or the pack would hold
    a delta whose base is gone."""
    store = afk.Store(tmp_path, pack_loose_limit=8)
    with store.create("r") as run:
        for seq in range(1, 6):
            run.checkpoint("runtime_state", _payload(seq), step=seq)
        run.loosen_head()
        name = checkpoint_name(3, "runtime_state")
        keyframe = codec.pack_frame(
            codec.KIND_CHECKPOINT,
            codec.compress(codec.decompress_chain(*_chain(store, 3))),
        )
        fsio.atomic_write(run.paths.dir / name, keyframe)
        run.anchor_head()
        (report,) = [run.pack(full=True)]
        assert report.packed_files == 4
    reader = store.open("r")
    three = next(f for f in reader.checkpoint_files() if f.seq == 3)
    assert three.pack is not None and reader.stored_bytes(three) == keyframe
    assert [c.payload for c in reader.history()] == [_payload(s) for s in range(1, 6)]
    assert reader.verify().ok


def _chain(store: afk.Store, seq: int) -> tuple[list[bytes], list[str]]:
    """The zstd bodies checkpoint ``seq`` decodes from (keyframe first), and their names."""
    reader = store.open("r")
    files = {f.seq: f for f in reader.checkpoint_files()}
    bodies: list[bytes] = []
    names: list[str] = []
    while True:
        f = files[seq]
        header, body = codec.unpack_frame(
            reader.stored_bytes(f), f.name, expect_kind=codec.KIND_CHECKPOINT
        )
        bodies.insert(0, body)
        names.insert(0, f.name)
        if not header.is_delta:
            return bodies, names
        seq = header.base_seq


def test_the_async_writer_packs_in_its_background_thread(tmp_path: Path) -> None:
    store = afk.Store(tmp_path, pack_loose_limit=8)
    writer = DurableWriter(store.create("r"), "async", coalesce_runtime_state=False)
    for seq in range(1, 81):
        writer.checkpoint("runtime_state", _payload(seq), step=seq)
    writer.finish("done")
    writer.close()
    loose, packs = scan_run_files(store.paths("r").dir)
    assert packs and len(loose) <= 16
    assert [c.payload for c in store.open("r").history()][-2] == _payload(80)


def test_fork_diff_verify_export_and_resume_on_a_packed_run(tmp_path: Path, capsys) -> None:
    store = afk.Store(tmp_path, pack_loose_limit=None)
    job = cli_jobs.count_job.with_store(store)
    outside = tmp_path / "outside.txt"
    cli_jobs.FAIL_AT[:] = [60]
    with pytest.raises(RuntimeError, match="planned failure"):
        job.run(80, str(outside), run_id="job")
    exported = export_records(store.open("job"))
    assert store.pack()[0].packed_files > 50

    # export: the same records as before packing.
    assert export_records(store.open("job")) == exported
    # verify, log, inspect and diff through the command line.
    assert cli_main(["--root", str(tmp_path), "verify", "job"]) == 0
    capsys.readouterr()
    assert cli_main(["--root", str(tmp_path), "log", "job", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert sum(1 for r in rows if r["pack"]) > 50 and not any(r["error"] for r in rows)
    assert cli_main(["--root", str(tmp_path), "diff", "job", "10", "40", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["changed"]
    assert cli_main(["--root", str(tmp_path), "inspect", "job", "50", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["seq"] == 50

    # fork inside the pack (a new pack for the fork), then resume the fork.
    reader = store.open("job")
    at = next(f for f in reversed(reader.checkpoint_files()) if f.pack and f.seq < 40)
    info = store.fork("job", at.seq, "forked")
    forked = store.open("forked")
    assert forked.latest().payload == reader.load(at).payload
    assert forked.verify().ok
    # resume: the failed run continues from its packed state; each item ran once.
    assert afk.resume("job", store=store) == cli_jobs.expected_total(80)
    lines = outside.read_text().splitlines()
    assert sorted(int(line.split()[0]) for line in lines) == list(range(80))
    assert info.run_id == "forked"


def test_a_keyed_fork_shares_signed_packs(tmp_path: Path) -> None:
    store = afk.Store(tmp_path, key=KEY, pack_loose_limit=None)
    _write(store, "src", 70)
    store.pack(["src"])
    pack = next(n for n in _names(store, "src") if n.endswith(".pack"))
    parsed = parse_pack_name(pack)
    assert parsed is not None
    # the pack lies wholly before the fork point: hard-linked as it is (a fork at the
    # pack's own last seq rewrites it: tests/storage/ops/test_fork.py)
    store.fork("src", parsed.last + 1, "whole")
    assert (
        os.stat(store.paths("whole").dir / pack).st_ino
        == os.stat(store.paths("src").dir / pack).st_ino
    )
    store.fork("src", 40, "part")  # the pack reaches past 40: rewritten, signed for the fork
    for run_id, seq in (("whole", parsed.last + 1), ("part", 40)):
        reader = store.open(run_id)
        assert reader.verify().ok, reader.verify().problems
        assert reader.latest().payload == _payload(seq)
        with store.resume_writer(run_id) as run:
            run.checkpoint("runtime_state", {"more": 1}, step=1)
        assert store.open(run_id).verify().ok


@pytest.mark.parametrize("key", [None, KEY])
def test_gc_compacts_a_packed_run(tmp_path: Path, key: str | None) -> None:
    store = afk.Store(tmp_path, key=key, pack_loose_limit=None)
    _write(store, "r", 100)
    store.pack()
    before = store.open("r").resume_state().state
    report = store.gc(RetentionPolicy(keep_runtime_states=2, keep_latest_step=True))
    assert not report.errors, report.errors
    assert report.compacted[0].deleted_files > 80
    reader = store.open("r")
    assert reader.verify().ok, reader.verify().problems
    assert reader.resume_state().state == before
    assert len(reader.checkpoint_files()) < 10
    assert len([n for n in _names(store, "r") if n.endswith(".pack")]) == 1


def test_a_damaged_pack_is_reported_and_the_rest_still_reads(tmp_path: Path) -> None:
    store = afk.Store(tmp_path, pack_loose_limit=None)
    _write(store, "r", 40, finish=True)
    store.pack()
    pack = next(p for p in store.paths("r").dir.iterdir() if p.suffix == ".pack")
    data = bytearray(pack.read_bytes())
    data[100] ^= 0xFF  # inside the first (and only) block
    pack.write_bytes(bytes(data))
    reader = store.open("r")
    assert reader.resume_state().result == {"done": 40}  # the newest is loose, a keyframe
    report = reader.verify()
    assert not report.ok
    assert any(p.path == str(pack) and "crc32" in p.reason for p in report.problems)
    assert cli_main(["--root", str(tmp_path), "verify", "r"]) == 1


def test_a_store_without_the_key_does_not_pack_a_signed_run(tmp_path: Path) -> None:
    _write(afk.Store(tmp_path, key=KEY, pack_loose_limit=None), "r", 10)
    (report,) = afk.Store(tmp_path).pack()
    assert report.errors and "signed" in report.errors[0]
    with pytest.raises(AfkLocalError, match="signed"):
        pack_run(afk.Store(tmp_path).paths("r"), afk.Store(tmp_path).codec)
    assert not any(n.endswith(".pack") for n in _names(afk.Store(tmp_path), "r"))


def test_pack_skips_a_live_run_and_reports_a_dry_run(tmp_path: Path, capsys) -> None:
    store = afk.Store(tmp_path, pack_loose_limit=None)
    _write(store, "idle", 20)
    with store.create("live") as run:
        run.checkpoint("runtime_state", {}, step=1)
        assert cli_main(["--root", str(tmp_path), "pack", "--dry-run", "--json"]) == 0
        reports = {r["run_id"]: r for r in json.loads(capsys.readouterr().out)}
        assert reports["live"]["skipped"]
        assert reports["idle"]["packed_files"] == 19 and reports["idle"]["files_after"] == 2
        assert len(_names(store, "idle")) == 23  # nothing changed
        assert cli_main(["--root", str(tmp_path), "pack", "idle"]) == 0
    assert "1 run(s) checked, 19 checkpoint file(s) packed" in capsys.readouterr().out
    assert len(_names(store, "idle")) == 6  # meta, lock, latest, newest file, pack, MANIFEST


# -- kill -9 while packing ---------------------------------------------------------------

PACK_CHILD = r"""
import sys, afk_local as afk
from afk_local.testing import kill_at_io_call
switch = kill_at_io_call(int(sys.argv[2]))
reports = afk.Store(sys.argv[1]).pack()
assert not reports[0].errors, reports[0].errors
print("calls", switch.calls, flush=True)
"""


def _check_every_checkpoint(store: afk.Store, count: int) -> None:
    reader = store.open("r")
    assert [c.payload for c in reader.history()] == [_payload(s) for s in range(1, count + 1)]
    assert not reader.skipped
    report = reader.verify()
    assert report.ok, report.problems


def test_kill_at_every_io_call_of_a_pack_loses_nothing(tmp_path: Path, kill_points) -> None:
    """A real SIGKILL at a pack's durable I/O calls (``--torture``: every one; the default
    suite: 10, see ``kill_points``; the explorer's ``pack`` workload checks them all)."""
    fixture = tmp_path / "fixture"
    store = afk.Store(fixture, pack_loose_limit=None)
    _write(store, "r", 14)
    pack_run(store.paths("r"), store.codec, keep_from=6)  # an older pack to merge with
    full = run(PACK_CHILD, str(_copy(fixture, tmp_path / "count")), "0")
    assert full.returncode == 0, full.stderr
    total = int(full.stdout.split()[-1])
    assert total >= 12  # the pack's publish, the removals, the directory fsyncs
    for kill_at in kill_points(total, 10):
        root = _copy(fixture, tmp_path / f"k{kill_at}")
        killed = run(PACK_CHILD, str(root), str(kill_at))
        assert killed.returncode == -9, (kill_at, killed.stderr)
        _check_every_checkpoint(afk.Store(root), 14)
        (report,) = afk.Store(root).pack()  # the next pack finishes the job
        assert not report.errors, (kill_at, report.errors)
        assert len(_names(afk.Store(root), "r")) == 6, kill_at  # + MANIFEST
        _check_every_checkpoint(afk.Store(root), 14)


def _copy(source: Path, target: Path) -> Path:
    shutil.copytree(source, target, symlinks=True)
    return target


LIVE_WRITER = r"""
import sys, afk_local as afk
store = afk.Store(sys.argv[1], pack_loose_limit=8)
run = store.resume_writer("r") if store.exists("r") else store.create("r")
def payload(seq):
    return {"seq": seq, "log": [f"line {i} " * 8 for i in range(seq % 40)]}
while True:
    seq = run.seq + 1
    run.checkpoint("runtime_state" if seq % 2 else "step_started", payload(seq), step=seq)
    print(seq, flush=True)
"""


def test_random_sigkills_of_a_packing_writer_lose_nothing(tmp_path: Path, trials) -> None:
    rng = random.Random(18)
    acked = 0
    for _ in range(trials(8, 200)):
        child = spawn(LIVE_WRITER, str(tmp_path))
        killed = kill_after(child, acks=rng.randint(5, 60), seconds=20)
        assert killed.returncode == -9, killed.stderr
        if killed.lines:
            acked = int(killed.lines[-1])
        store = afk.Store(tmp_path)
        if acked:
            reader = store.open("r")
            latest = reader.latest()
            assert latest is not None and latest.seq >= acked
            history = reader.history()
            assert not reader.skipped
            assert [c.seq for c in history] == list(range(1, len(history) + 1))
            assert all(c.payload == _payload(c.seq) for c in history)
    _, packs = scan_run_files(afk.Store(tmp_path).paths("r").dir)
    assert packs and acked > 8
    assert afk.Store(tmp_path).open("r").verify().ok


class LazyMirror:
    """A mirror that runs behind: at every 5th file it copies all it was told of but the
    last two (a slow background uploader); flush copies everything."""

    url = "lazy://test"

    def __init__(self) -> None:
        self.uploaded: dict[str, bytes] = {}
        self.lost: list[str] = []

    def attach(self, paths, record_codec):
        mirror = self

        class Run:
            def __init__(self) -> None:
                self.pending: list[str] = []

                self.seq = 0
                self.told = 0

            def published(self, name: str) -> None:
                self.pending.append(name)
                self.told += 1
                if self.told % 5 == 0:
                    self._upload(len(self.pending) - 2)

            def _upload(self, count: int) -> None:
                for name in self.pending[:count]:
                    try:
                        mirror.uploaded[name] = (paths.dir / name).read_bytes()
                        self.seq = max(self.seq, int(name.split(".")[0]))
                    except FileNotFoundError:
                        mirror.lost.append(name)
                del self.pending[:count]

            def uploaded_seq(self) -> int:
                return self.seq

            def flush(self, timeout: float) -> None:
                self._upload(len(self.pending))

            def close(self) -> None:
                self.flush(0)

            def meta_replaced(self) -> None: ...
            def before_append(self) -> None: ...
            def synced(self, end: int) -> None: ...
            def appended(self, end: int) -> None: ...
            def check(self) -> None: ...

        return Run()

    def close(self) -> None: ...


def test_a_mirrored_writer_packs_only_what_its_mirror_already_holds(tmp_path: Path) -> None:
    lazy = LazyMirror()
    store = afk.Store(tmp_path, mirror=lazy, pack_loose_limit=8)
    with store.create("r") as run:
        for i in range(60):
            run.checkpoint("runtime_state", {"i": i}, step=i)
    files = os.listdir(store.paths("r", refuse_links=True).dir)
    assert any(n.endswith(".pack") for n in files)
    assert lazy.lost == []  # every checkpoint file reached the mirror before it was packed
    assert sorted(lazy.uploaded) == [checkpoint_name(i, "runtime_state") for i in range(1, 61)]


def test_a_keyed_packed_run_is_not_rolled_back_but_an_older_packed_copy_is(tmp_path: Path) -> None:
    store = afk.Store(tmp_path / "s", key=KEY, pack_loose_limit=None)
    _write(store, "r", 30)
    run_dir = store.paths("r", refuse_links=True).dir
    old = tmp_path / "old-copy"
    shutil.copytree(run_dir, old, symlinks=True)
    with store.resume_writer("r") as run:
        for seq in range(31, 41):
            run.checkpoint("runtime_state", _payload(seq), step=seq)
    store.pack(["r"])
    assert any(n.endswith(".pack") for n in os.listdir(run_dir))
    assert store.open("r").verify().ok  # packing is not a rollback

    shutil.rmtree(run_dir)  # an older copy of the run put back, packed too
    shutil.copytree(old, run_dir, symlinks=True)
    (report,) = store.pack(["r"])
    assert report.packed_files == 0 and "rolled back" in report.errors[0]
    pack_run(store.paths("r", refuse_links=True), store.codec)  # packed anyway, below the Store
    problems = store.open("r").verify().problems
    assert any("rolled back" in p.reason for p in problems), problems
    with pytest.raises(afk.RunRolledBackError):
        store.resume_writer("r")
