"""The delta policy: delta or keyframe, chain length, bases per phase."""

from __future__ import annotations

import random
from pathlib import Path

import afk_local as afk
from afk_local.storage.format import codec
from afk_local.storage.format.layout import scan_checkpoints
from afk_local.storage.rundir.delta_policy import MAX_CHAINS, DeltaPolicy


def _raw(i: int) -> bytes:
    return b"".join(b"line %d of a growing state\n" % j for j in range(100 + i))


def _header(frame: bytes) -> codec.FrameHeader:
    return codec.unpack_frame(frame, "test", expect_kind=codec.KIND_CHECKPOINT)[0]


def _is_delta(frame: bytes) -> bool:
    return _header(frame).is_delta


def test_a_keyframe_after_max_chain_deltas() -> None:
    policy = DeltaPolicy(max_chain=3)
    kinds = []
    for seq in range(1, 10):
        policy.frame(seq, "runtime_state", _raw(seq), None)
        kinds.append(policy.keyframe_written)
    assert kinds == [True, False, False, False, True, False, False, False, True]
    chain = policy.chain("runtime_state")
    assert chain is not None and chain.keyframe == 9 and chain.length == 0


def test_the_frame_says_what_the_policy_decided() -> None:
    policy = DeltaPolicy()
    first = policy.frame(1, "runtime_state", _raw(1), None)
    second = policy.frame(2, "runtime_state", _raw(2), None)
    assert not _is_delta(first)
    assert _is_delta(second)
    assert _header(second).base_seq == 1


def test_each_phase_deltas_against_its_own_newest_checkpoint() -> None:
    policy = DeltaPolicy()
    policy.frame(1, "runtime_state", _raw(1), None)
    policy.frame(2, "step_started", b"tiny", None)
    frame = policy.frame(3, "runtime_state", _raw(3), None)
    assert _header(frame).base_seq == 1
    assert sorted(policy.keyframes_after(0)) == [1, 2]
    assert policy.keyframes_after(2) == [1]


def test_a_delta_as_large_as_a_keyframe_is_written_as_a_keyframe() -> None:
    policy = DeltaPolicy()
    policy.frame(1, "runtime_state", _raw(1), None)
    policy.frame(2, "runtime_state", random.Random(0).randbytes(4000), None)  # nothing shared
    assert policy.keyframe_written


def test_the_least_recently_used_phases_are_forgotten() -> None:
    policy = DeltaPolicy()
    for seq in range(1, MAX_CHAINS + 2):
        policy.frame(seq, f"phase_{seq}", _raw(seq), None)
    assert policy.chain("phase_1") is None
    assert policy.chain(f"phase_{MAX_CHAINS + 1}") is not None


def test_a_resumed_writer_starts_with_a_keyframe(tmp_path: Path) -> None:
    store = afk.Store(tmp_path)
    with store.create("r") as run:
        for step in range(3):
            run.checkpoint("runtime_state", {"log": ["x" * 50] * (10 + step)}, step=step)
    with store.resume_writer("r") as run:
        run.checkpoint("runtime_state", {"log": ["x" * 50] * 20}, step=3)
    files = scan_checkpoints(store.paths("r").dir)
    run_dir = store.paths("r").dir
    deltas = [
        _is_delta((run_dir / f.name).read_bytes()) for f in files if f.phase == "runtime_state"
    ]
    assert deltas == [False, True, True, False]
