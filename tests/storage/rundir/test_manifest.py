"""A run's MANIFEST: one record of what is live, so rewrites can never lose data (issue 33).

Each test names the finding of issue 33 it covers. Crash findings are tested with real
child processes killed by SIGKILL at a chosen durable I/O call.
"""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from proc import kill_after, run, spawn

import afk_local as afk
from afk_local.cli.main import main as cli_main
from afk_local.errors import AfkLocalError, CheckpointCorruptionError
from afk_local.storage import fsio
from afk_local.storage.format.codec import KIND_MANIFEST, pack_frame
from afk_local.storage.format.layout import parse_pack_name, scan_run_files
from afk_local.storage.format.manifest import (
    MAX_MANIFEST_PACKS,
    Manifest,
    decode_manifest,
    encode_manifest,
)
from afk_local.storage.ops.retention import RetentionPolicy
from afk_local.storage.rundir.options import StoreOptions
from afk_local.storage.rundir.packing import pack_run
from afk_local.storage.rundir.read.catalog import RunCatalog

KEY = "manifest test key"
COUNT = 30
POLICY = RetentionPolicy(keep_runtime_states=2)


def _payload(seq: int) -> dict[str, object]:
    return {"seq": seq, "log": [f"line {i} " * 8 for i in range(seq % 40)]}


def _write(store: afk.Store, run_id: str, count: int) -> None:
    """Two interleaved delta chains (step_started, runtime_state), as the agent protocol has."""
    with store.create(run_id) as run:
        while run.seq < count:
            seq = run.seq + 1
            run.checkpoint("runtime_state" if seq % 2 else "step_started", _payload(seq), step=seq)


def _packed_run(root: Path, key: str | None) -> afk.Store:
    """A run of COUNT checkpoints, all but the newest packed in two packs."""
    store = afk.Store(root, key=key, pack_loose_limit=None)
    _write(store, "r", COUNT)
    pack_run(store.paths("r"), store.codec, keep_from=20)
    pack_run(store.paths("r"), store.codec, merge=False)
    _, packs = scan_run_files(store.paths("r").dir)
    assert len(packs) == 2
    return store


def _half_packed_run(root: Path, key: str | None) -> afk.Store:
    """A run of COUNT checkpoints, 1-11 packed and the rest loose: gc dooms loose deltas
    (13, a step_started on 11) whose base is a doomed packed checkpoint."""
    store = afk.Store(root, key=key, pack_loose_limit=None)
    _write(store, "r", COUNT)
    pack_run(store.paths("r"), store.codec, keep_from=12)
    return store


def _copy(source: Path, target: Path) -> Path:
    shutil.copytree(source, target, symlinks=True)
    return target


def _check_acknowledged(root: Path, key: str | None, newest: int = COUNT) -> None:
    """The newest acknowledged checkpoint reads with its content, resume works, verify is ok."""
    reader = afk.Store(root, key=key).open("r")
    latest = reader.latest()
    assert latest is not None and latest.seq == newest and latest.payload == _payload(newest)
    state = reader.resume_state()  # raises if the newest runtime_state is unreadable
    assert state.checkpoint is not None
    assert state.checkpoint.payload == _payload(state.checkpoint.seq)
    report = reader.verify()
    assert report.ok, report.problems


def _manifest(store: afk.Store, run_id: str = "r") -> Manifest | None:
    return RunCatalog(store.paths(run_id), signer=store.codec.signer).manifest()


# -- the record itself ----------------------------------------------------------------


def test_manifest_round_trips_and_is_bound_to_its_run() -> None:
    manifest = Manifest("r", 3, 20, ("pack-000000000001-000000000019-0123abcd.pack",))
    data = encode_manifest(manifest)
    assert decode_manifest(data, "M", run_id="r", signer=None) == manifest
    with pytest.raises(CheckpointCorruptionError, match="found in run 'other'"):
        decode_manifest(data, "M", run_id="other", signer=None)


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"loose_from": 10}, "reaches loose_from"),
        ({"loose_from": 0}, "loose_from 0 out of range"),
        ({"generation": 0}, "generation 0"),
        ({"packs": ("../run.meta",)}, "is not a pack name"),
        ({"packs": ("pack-000000000001-000000000019-0123abcd.pack",) * 2}, "overlaps"),
        ({"packs": ("x",) * (MAX_MANIFEST_PACKS + 1)}, "over 4096"),
        ({"version": 2}, "version 2"),
    ],
)
def test_a_hostile_manifest_is_damage_naming_the_file(fields: dict, reason: str) -> None:
    base = {
        "run_id": "r",
        "generation": 1,
        "loose_from": 20,
        "packs": ("pack-000000000001-000000000019-0123abcd.pack",),
    }
    import msgspec  # noqa: PLC0415

    body = msgspec.msgpack.encode({**base, **fields})
    data = pack_frame(KIND_MANIFEST, body)  # a correct crc: only the fields are hostile
    with pytest.raises(CheckpointCorruptionError, match=reason) as caught:
        decode_manifest(data, "/x/MANIFEST", run_id="r", signer=None)
    assert caught.value.path == "/x/MANIFEST"


def test_a_damaged_manifest_is_reported_skipped_by_readers_and_stops_rewrites(
    tmp_path: Path,
) -> None:
    store = _packed_run(tmp_path, None)
    path = store.paths("r").manifest
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    report = store.open("r").verify()
    assert any(p.path == str(path) and "crc32" in p.reason for p in report.problems)
    reader = store.open("r")  # read as a run without one: every copy decodes the same
    assert [c.payload for c in reader.history()] == [_payload(s) for s in range(1, COUNT + 1)]
    assert [s.name for s in reader.skipped] == ["MANIFEST"]
    (packed,) = store.pack(["r"])
    assert packed.errors and "MANIFEST" in packed.errors[0]  # nothing rewritten on a guess
    gc = store.gc(POLICY)
    assert gc.errors and "MANIFEST" in gc.errors[0]
    assert path.read_bytes() == bytes(data)


def test_a_manifest_naming_a_missing_pack_is_damage(tmp_path: Path) -> None:
    store = _packed_run(tmp_path, None)
    manifest = _manifest(store)
    assert manifest is not None
    (store.paths("r").dir / manifest.packs[0]).unlink()
    report = store.open("r").verify()
    assert any("which is missing" in p.reason for p in report.problems), report.problems


def test_keyed_manifest_must_be_signed_for_its_run(tmp_path: Path) -> None:
    store = _packed_run(tmp_path, KEY)
    manifest = _manifest(store)
    assert manifest is not None
    store.paths("r").manifest.write_bytes(encode_manifest(manifest))  # unsigned
    report = store.open("r").verify()
    assert any("unsigned" in p.reason for p in report.problems), report.problems


def test_never_packed_run_has_no_manifest_and_all_loose_files_are_live(tmp_path: Path) -> None:
    store = afk.Store(tmp_path, pack_loose_limit=None)
    _write(store, "r", 12)
    assert not store.paths("r").manifest.exists()
    reader = store.open("r")
    assert [c.seq for c in reader.history()] == list(range(1, 13))
    assert reader.verify().ok


def test_packs_without_manifest_still_read_and_are_adopted_by_the_next_pack(
    tmp_path: Path,
) -> None:
    """A run packed before manifests existed: loose wins, then one merge adopts it."""
    store = _packed_run(tmp_path, None)
    store.paths("r").manifest.unlink()
    reader = store.open("r")
    assert [c.payload for c in reader.history()] == [_payload(s) for s in range(1, COUNT + 1)]
    with store.create("r2") as run:  # not needed; keep the store busy with another run
        run.checkpoint("runtime_state", {}, step=1)
    (report,) = store.pack(["r"], merge=False)
    assert not report.errors
    manifest = _manifest(store)
    assert manifest is not None and len(manifest.packs) == 1 and manifest.loose_from == COUNT
    _check_acknowledged(tmp_path, None)


# -- finding 1 and 3: gc of a packed run, killed, then gc again ------------------------------

GC_CHILD = r"""
import sys, afk_local as afk
from afk_local.testing import kill_at_io_call
from afk_local.storage.ops.retention import RetentionPolicy
switch = kill_at_io_call(int(sys.argv[2]))
report = afk.Store(sys.argv[1], key=sys.argv[3] or None).gc(RetentionPolicy(keep_runtime_states=2))
assert not report.errors, report.errors
print("calls", switch.calls, flush=True)
"""


def _gc(root: Path, key: str | None, kill_at: int) -> subprocess.CompletedProcess[str]:
    return run(GC_CHILD, str(root), str(kill_at), key or "")


@pytest.mark.parametrize("shape", [_packed_run, _half_packed_run], ids=["packed", "half-loose"])
@pytest.mark.parametrize("key", [None, KEY])
def test_gc_of_a_packed_run_killed_then_gc_again_loses_nothing(
    tmp_path: Path, key, shape, request: pytest.FixtureRequest
) -> None:
    """Findings 1 and 3: a kill in gc, then a second gc killed too, then a third.

    ``half-loose``: a kill after gc published its MANIFEST but before it deleted a doomed
    loose delta left that delta live by the manifest's rule, with its packed base gone
    (found by the rewrite torture: gc now deletes doomed loose files first).

    ``--torture`` kills at every durable I/O call of gc; the default suite at five of
    them, drawn at random (the crash explorer's ``gc-packed`` and ``gc-half-loose``
    workloads check every crash point of the same shapes, deterministically)."""
    fixture = tmp_path / "fixture"
    shape(fixture, key)
    full = _gc(_copy(fixture, tmp_path / "count"), key, 0)
    assert full.returncode == 0, full.stderr
    total = int(full.stdout.split()[1])
    assert total >= 10
    rng = random.Random(33)
    points = list(range(1, total + 1))
    if not request.config.getoption("--torture"):
        points = sorted(rng.sample(points, 5))
    for kill_at in points:
        root = _copy(fixture, tmp_path / f"k{kill_at}")
        first = _gc(root, key, kill_at)
        assert first.returncode == -9, (kill_at, first.stderr)
        _check_acknowledged(root, key)
        second = _gc(root, key, rng.randint(1, total))  # a kill in the second gc (finding 3)
        assert second.returncode in (0, -9), (kill_at, second.stderr)
        _check_acknowledged(root, key)
        third = _gc(root, key, 0)
        assert third.returncode == 0, (kill_at, third.stderr)
        _check_acknowledged(root, key)
        shutil.rmtree(root)
    # and a cold verify in a new process, through the CLI, agrees
    verify = run(
        "import sys; from afk_local.cli.main import main; sys.exit(main(sys.argv[1:]))",
        "--root",
        str(fixture),
        "verify",
        "r",
        env={"AFK_LOCAL_KEY": key} if key else None,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_verify_decodes_cold_and_fails_an_unreadable_newest_checkpoint(tmp_path: Path) -> None:
    """Finding 1's second half: a warm reader's cache cannot hide a missing base."""
    store = afk.Store(tmp_path, pack_loose_limit=None)
    _write(store, "r", 6)
    reader = store.open("r")
    assert reader.get(4).payload == _payload(4)  # the newest's base is now in the cache
    for seq, phase in ((4, "step_started"), (2, "step_started")):  # the newest's chain
        (store.paths("r").dir / f"{seq:012d}.{phase}.ckpt").unlink()
    report = reader.verify()
    assert not report.ok
    assert any("000000000006" in p.path for p in report.problems), report.problems


# -- finding 2: a pack whose directory entry never became durable ----------------------------

PACK_CHILD = r"""
import sys, afk_local as afk
from afk_local.testing import kill_at_io_call
switch = kill_at_io_call(int(sys.argv[2]))
reports = afk.Store(sys.argv[1]).pack()
assert not reports[0].errors, reports[0].errors
print("calls", switch.calls, flush=True)
"""


def _recording_store(root: Path) -> tuple[afk.Store, list[fsio.IoCall]]:
    calls: list[fsio.IoCall] = []
    env = fsio.Env(recorder=calls.append)
    options = dataclasses.replace(StoreOptions(), env=env, pack_loose_limit=None)
    return afk.Store(root, options=options), calls


def _check_publish_order(calls: list[fsio.IoCall], run_dir: Path) -> None:
    """Nothing is unlinked while a rename in the run directory is not durable yet."""
    pending: set[str] = set()  # renamed here, directory not fsynced since
    synced_since_start = False
    for call in calls:
        name = os.path.basename(call.path)
        if call.operation == "rename" and os.path.dirname(call.path) == str(run_dir):
            pending.add(name)
        elif call.operation == "fsync" and call.path == str(run_dir):
            pending.clear()
            synced_since_start = True
        elif call.operation == "unlink" and os.path.dirname(call.path) == str(run_dir):
            if name.startswith(fsio.TEMP_PREFIX):
                continue
            assert synced_since_start, f"{name} unlinked before any directory fsync"
            assert not pending, f"{name} unlinked while {pending} are not durable"


def test_pack_never_trusts_a_pack_whose_directory_entry_may_not_be_durable(
    tmp_path: Path,
    kill_points,
) -> None:
    """Finding 2: an earlier packer died after its rename, before its directory fsync
    (killed at each of its durable I/O calls under ``--torture``, at 10 by default)."""
    fixture = tmp_path / "fixture"
    store = afk.Store(fixture, pack_loose_limit=None)
    _write(store, "r", 14)
    full = run(PACK_CHILD, str(_copy(fixture, tmp_path / "count")), "0")
    assert full.returncode == 0, full.stderr
    total = int(full.stdout.split()[1])
    for kill_at in kill_points(total, 10):
        root = _copy(fixture, tmp_path / f"k{kill_at}")
        killed = run(PACK_CHILD, str(root), str(kill_at))
        assert killed.returncode == -9, (kill_at, killed.stderr)
        run_dir = root / "runs" / "r"
        before = _manifest(afk.Store(root))
        named_before = set(before.packs) if before is not None else set()
        second, calls = _recording_store(root)
        (report,) = second.pack()
        assert not report.errors, report.errors
        renamed = {os.path.basename(c.path) for c in calls if c.operation == "rename"}
        after = _manifest(second)
        assert after is not None
        for name in after.packs:  # every live pack was published durably by someone
            assert name in renamed or name in named_before, (kill_at, name)
        unlinks = [
            c
            for c in calls
            if c.operation == "unlink" and not os.path.basename(c.path).startswith(fsio.TEMP_PREFIX)
        ]
        if unlinks and not (set(after.packs) <= named_before):
            first_unlink = calls.index(unlinks[0])
            manifest_renames = [
                i
                for i, c in enumerate(calls)
                if c.operation == "rename" and c.path.endswith("MANIFEST")
            ]
            assert manifest_renames and manifest_renames[0] < first_unlink
            syncs = [
                i
                for i, c in enumerate(calls)
                if c.operation == "fsync" and c.path == str(run_dir) and i > manifest_renames[0]
            ]
            assert syncs and syncs[0] < first_unlink, kill_at
        _check_publish_order(calls, run_dir)
        _check_acknowledged(root, None, newest=14)


# -- finding 4: packing goes on after a gc that rewrote a packed checkpoint -------------------


def test_packing_goes_on_after_gc_rewrote_packed_checkpoints(tmp_path: Path) -> None:
    store = _packed_run(tmp_path, None)
    (compacted,) = store.gc(POLICY).compacted
    assert compacted.rewritten_files  # packed deltas rewritten as keyframes
    live = afk.Store(tmp_path, pack_loose_limit=8)
    with live.resume_writer("r") as writer:
        for _ in range(100):
            seq = writer.seq + 1
            writer.checkpoint(
                "runtime_state" if seq % 2 else "step_started", _payload(seq), step=seq
            )
    loose, packs = scan_run_files(store.paths("r").dir)
    assert packs and len(loose) <= 2 * 8 + 1, [f.name for f in loose]
    with afk.Store(tmp_path, pack_loose_limit=None).resume_writer("r") as writer:
        for _ in range(20):
            seq = writer.seq + 1
            writer.checkpoint("runtime_state", _payload(seq), step=seq)
    (report,) = afk.Store(tmp_path).pack(["r"])
    assert report.packed_files >= 20 and not report.errors
    _check_acknowledged(tmp_path, None, newest=COUNT + 120)


# -- finding 5 and 8: lock-free readers and fork while another process packs and merges -------

MERGING_WRITER = r"""
import sys, afk_local as afk
store = afk.Store(sys.argv[1], pack_loose_limit=4)
run = store.resume_writer("r") if store.exists("r") else store.create("r")
def payload(seq):
    return {"seq": seq, "log": [f"line {i} " * 8 for i in range(seq % 40)]}
while True:
    seq = run.seq + 1
    run.checkpoint("runtime_state" if seq % 2 else "step_started", payload(seq), step=seq)
    print(seq, flush=True)
"""


def test_lock_free_verify_and_fork_while_another_process_packs_and_merges(
    tmp_path: Path,
) -> None:
    """Findings 5 and 8: no false corruption, no raw FileNotFoundError."""
    child = spawn(MERGING_WRITER, str(tmp_path))
    try:
        assert child.stdout is not None
        while int(child.stdout.readline() or 0) < 12:
            pass
        store = afk.Store(tmp_path)
        deadline = time.monotonic() + 6
        verified = forks = 0
        while time.monotonic() < deadline:
            report = store.open("r").verify()
            assert report.ok, report.problems
            verified += 1
            try:
                store.fork("r", at_seq=3, new_run_id=f"f{forks}")
            except AfkLocalError as exc:  # allowed: one retryable line, never a traceback
                assert "try again" in str(exc)
            else:
                fork = store.open(f"f{forks}")
                assert [c.payload for c in fork.history()] == [_payload(s) for s in (1, 2, 3)]
            forks += 1
        assert verified >= 3
    finally:
        killed = kill_after(child, seconds=0)
    assert killed.returncode == -9
    _, packs = scan_run_files(store.paths("r").dir)
    assert packs
    assert store.open("r").verify().ok


# -- finding 9: --no-merge ------------------------------------------------------------------


def test_pack_no_merge_leaves_existing_packs_alone(tmp_path: Path, capsys) -> None:
    store = afk.Store(tmp_path, pack_loose_limit=None)
    _write(store, "r", 10)
    pack_run(store.paths("r"), store.codec)
    (old,) = scan_run_files(store.paths("r").dir)[1]
    inode = os.stat(store.paths("r").dir / old.name).st_ino
    with store.resume_writer("r") as writer:
        for _ in range(40):  # far more new bytes than the old pack holds
            seq = writer.seq + 1
            writer.checkpoint("runtime_state", _payload(seq), step=seq)
    assert cli_main(["--root", str(tmp_path), "pack", "--no-merge", "r"]) == 0
    capsys.readouterr()
    packs = scan_run_files(store.paths("r").dir)[1]
    assert len(packs) == 2 and old in packs
    assert os.stat(store.paths("r").dir / old.name).st_ino == inode
    assert cli_main(["--root", str(tmp_path), "pack", "r"]) == 0  # a full pack merges
    assert len(scan_run_files(store.paths("r").dir)[1]) == 1
    _check_acknowledged(tmp_path, None, newest=50)


# -- the hot path: a sync checkpoint costs what it did ---------------------------------------


def test_sync_checkpoint_fsyncs_are_unchanged_on_a_packed_run(tmp_path: Path) -> None:
    _packed_run(tmp_path, None)
    store, calls = _recording_store(tmp_path)
    with store.resume_writer("r") as writer:
        writer.checkpoint("runtime_state", _payload(COUNT + 1), step=COUNT + 1)
        calls.clear()
        writer.checkpoint("runtime_state", _payload(COUNT + 2), step=COUNT + 2)
        fsyncs = [c for c in calls if c.operation == "fsync"]
        assert len(fsyncs) == 2, fsyncs  # the file, the directory: no manifest on this path
        assert not any(c.path.endswith("MANIFEST") for c in calls)


def test_manifest_names_the_live_packs_and_rises_in_generation(tmp_path: Path) -> None:
    store = _packed_run(tmp_path, None)
    manifest = _manifest(store)
    assert manifest is not None and manifest.loose_from == COUNT
    assert [parse_pack_name(n) for n in manifest.packs] == manifest.pack_files()
    assert manifest.generation == 2
