"""Names and value types of a run directory (afk_local/storage/format/layout.py).

``CheckpointFile`` is a hand-written class (defining a dataclass costs ~1 ms at import,
on every reader's path): these pin the value semantics it must keep.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from afk_local.storage.format.layout import (
    CheckpointFile,
    PackFile,
    RunPaths,
    parse_checkpoint_name,
    parse_pack_name,
)
from afk_local.storage.format.records import RunStatus
from afk_local.storage.rundir.read.reader import ResumeState, Skipped


def test_a_checkpoint_is_the_same_checkpoint_loose_or_packed() -> None:
    loose = parse_checkpoint_name("000000000007.runtime_state.ckpt")
    assert loose == CheckpointFile(7, "runtime_state", "000000000007.runtime_state.ckpt")
    assert loose is not None and loose.pack is None
    packed = CheckpointFile(loose.seq, loose.phase, loose.name, pack="pack-x.pack")
    assert packed == loose and hash(packed) == hash(loose)
    assert {loose, packed} == {loose}
    assert packed != CheckpointFile(7, "tool_pre", "000000000007.tool_pre.ckpt")
    assert packed != (7, "runtime_state", loose.name)  # not a tuple


def test_checkpoints_sort_by_seq_then_phase_then_name() -> None:
    names = ["000000000010.a.ckpt", "000000000002.b.ckpt", "000000000002.a.ckpt"]
    files = sorted(f for f in map(parse_checkpoint_name, names) if f is not None)
    assert [f.name for f in files] == [names[2], names[1], names[0]]
    assert files[0] < files[1] <= files[1] < files[2]
    assert files[2] > files[0] and files[2] >= files[2]
    with pytest.raises(TypeError):
        _ = files[0] < 3  # type: ignore[operator]


def test_a_checkpoint_file_is_immutable_and_pickles() -> None:
    f = CheckpointFile(3, "runtime_state", "000000000003.runtime_state.ckpt", pack="p.pack")
    with pytest.raises(AttributeError):
        f.seq = 4
    with pytest.raises(AttributeError):
        del f.pack
    copy = pickle.loads(pickle.dumps(f))
    assert copy == f and copy.pack == "p.pack"
    assert repr(f) == (
        "CheckpointFile(seq=3, phase='runtime_state', "
        "name='000000000003.runtime_state.ckpt', pack='p.pack')"
    )


def test_the_other_layout_values_compare_by_value_and_are_immutable() -> None:
    pack = parse_pack_name("pack-000000000001-000000000009-0123abcd.pack")
    assert pack == PackFile(1, 9, "pack-000000000001-000000000009-0123abcd.pack")
    assert sorted([PackFile(5, 6, "b"), PackFile(1, 9, "a")])[0].first == 1
    paths = RunPaths("r1", Path("/x/runs/r1"))
    assert paths == RunPaths("r1", Path("/x/runs/r1")) and paths.latest == Path("/x/runs/r1/latest")
    state = ResumeState("r1", RunStatus.RUNNING, False, None, None, 0, (Skipped("n", "why"),))
    assert state.state is None and state.skipped[0].reason == "why"
    for value, field in ((pack, "first"), (paths, "run_id"), (state, "latest_seq")):
        with pytest.raises(AttributeError):
            setattr(value, field, 1)
