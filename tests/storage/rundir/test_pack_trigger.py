"""The pack trigger: a writer packs at a keyframe past its loose limit, or at twice it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from afk_local.storage.format.codec import RecordCodec
from afk_local.storage.format.layout import RunPaths
from afk_local.storage.rundir.delta_policy import DeltaPolicy
from afk_local.storage.rundir.packing import PackReport
from afk_local.storage.rundir.write import pack_trigger
from afk_local.storage.rundir.write.pack_trigger import PackTrigger


@pytest.fixture
def packed(monkeypatch: pytest.MonkeyPatch) -> list[int | None]:
    """The ``keep_from`` of every pack the trigger asked for (nothing is written)."""
    calls: list[int | None] = []

    def fake_pack_run(paths: RunPaths, codec: RecordCodec, **options: object) -> PackReport:
        keep_from = options.get("keep_from")
        calls.append(keep_from if isinstance(keep_from, int) else None)
        return PackReport(paths.run_id, loose_left=1)

    monkeypatch.setattr(pack_trigger, "pack_run", fake_pack_run)
    return calls


def _trigger(tmp_path: Path, limit: int, **options: Any) -> PackTrigger:
    paths = RunPaths("r", tmp_path)
    return PackTrigger(paths, RecordCodec(), limit=limit, loose=0, delta=DeltaPolicy(), **options)


def test_no_pack_below_the_limit(tmp_path: Path, packed: list[int | None]) -> None:
    trigger = _trigger(tmp_path, limit=4)
    for seq in range(1, 4):
        trigger.published(seq, keyframe=True)
    assert packed == []
    assert trigger.loose == 3


def test_past_the_limit_a_keyframe_packs(tmp_path: Path, packed: list[int | None]) -> None:
    trigger = _trigger(tmp_path, limit=4)
    for seq in range(1, 5):
        trigger.published(seq, keyframe=False)
    assert packed == []  # at the limit, but inside a delta chain
    trigger.published(5, keyframe=True)
    assert len(packed) == 1
    assert trigger.loose == 1  # what the packer left loose


def test_at_twice_the_limit_it_packs_whatever_the_checkpoint(
    tmp_path: Path, packed: list[int | None]
) -> None:
    trigger = _trigger(tmp_path, limit=4)
    for seq in range(1, 9):
        trigger.published(seq, keyframe=False)
    assert len(packed) == 1


def test_a_zero_limit_never_packs_on_its_own(tmp_path: Path, packed: list[int | None]) -> None:
    trigger = _trigger(tmp_path, limit=0)
    for seq in range(1, 100):
        trigger.published(seq, keyframe=True)
    assert packed == []


def test_chains_being_extended_stay_loose_back_to_their_keyframes(
    tmp_path: Path, packed: list[int | None]
) -> None:
    delta = DeltaPolicy()
    trigger = PackTrigger(RunPaths("r", tmp_path), RecordCodec(), limit=8, loose=0, delta=delta)
    raw = b"a state that grows\n" * 200
    for seq in range(1, 9):  # one chain: keyframe 1, deltas 2..8
        delta.frame(seq, "runtime_state", raw + b"x" * seq, None)
        trigger.published(seq, delta.keyframe_written)
    delta.frame(9, "step_started", b"tiny", None)
    trigger.published(9, delta.keyframe_written)
    # the chain's keyframe (1) is older than half the limit: only the newest half stays
    assert packed == [6]


def test_a_failed_pack_is_reported_not_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_pack_run(*args: object, **options: object) -> PackReport:
        raise OSError("disk full")

    monkeypatch.setattr(pack_trigger, "pack_run", broken_pack_run)
    failures: list[BaseException] = []
    trigger = _trigger(tmp_path, limit=1, on_failure=failures.append)
    trigger.published(1, keyframe=True)  # the checkpoint stays acknowledged
    assert [str(f) for f in failures] == ["disk full"]
    with pytest.raises(OSError, match="disk full"):
        trigger.pack()
    assert len(failures) == 2


class _BehindMirror:
    """A mirror that has uploaded files up to ``uploaded``; its flush always times out."""

    def __init__(self) -> None:
        self.uploaded = 0
        self.flushes = 0

    def uploaded_seq(self) -> int:
        return self.uploaded

    def flush(self, timeout: float) -> None:
        self.flushes += 1
        raise TimeoutError("mirror behind")


def test_a_mirror_that_is_behind_postpones_packing_without_waiting_for_it(
    tmp_path: Path, packed: list[int | None]
) -> None:
    mirror = _BehindMirror()
    trigger = _trigger(tmp_path, limit=2, mirror=mirror)
    for seq in range(1, 5):
        trigger.published(seq, keyframe=True)
    assert packed == []
    assert mirror.flushes == 0, "the checkpoint path never waits on the network"
    mirror.uploaded = 4  # the mirror caught up: the next keyframe packs what it holds
    trigger.published(5, keyframe=True)
    assert len(packed) == 1 and mirror.flushes == 0
    with pytest.raises(TimeoutError):
        trigger.pack()  # asked for explicitly: the mirror's error is the caller's
