"""StateCheckpoint: round trip, completion, clear, and a crash in the middle of save."""

from __future__ import annotations

import random

import proc
import pytest

import afk_local as afk
from afk_local.runner.run.state_checkpoint import StateCheckpoint


def test_round_trip(tmp_path):
    ckpt = StateCheckpoint(tmp_path / "c")
    assert ckpt.load() is None
    assert ckpt.status == "fresh"
    ckpt.save({"i": 1, "rows": [1, 2]})
    ckpt.save({"i": 2, "rows": [1, 2, 3]})
    assert ckpt.load() == {"i": 2, "rows": [1, 2, 3]}
    # a second object on the same directory (a re-run notebook cell) shares the writer
    again = StateCheckpoint(tmp_path / "c")
    assert again.load() == {"i": 2, "rows": [1, 2, 3]}
    again.save({"i": 3})
    ckpt.close()
    assert StateCheckpoint(tmp_path / "c").load() == {"i": 3}


def test_complete_and_clear(tmp_path):
    ckpt = StateCheckpoint(tmp_path / "c")
    assert ckpt.get_result() is None
    ckpt.save({"i": 5})
    ckpt.mark_complete({"answer": 42})
    assert ckpt.is_complete
    assert ckpt.load() is None
    assert StateCheckpoint(tmp_path / "c").get_result() == {"answer": 42}
    ckpt.clear()
    assert ckpt.load() is None and ckpt.get_result() is None and ckpt.status == "fresh"
    ckpt.save({"i": 0})
    assert ckpt.load() == {"i": 0}
    ckpt.close()


def test_same_files_as_any_run(tmp_path):
    ckpt = StateCheckpoint(tmp_path / "c")
    ckpt.save({"i": 1})
    ckpt.close()
    store = afk.Store(tmp_path / "c")
    assert [r.run_id for r in store.runs()] == ["state"]
    assert store.open("state").verify().ok


def test_path_must_be_a_directory(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(NotADirectoryError):
        StateCheckpoint(tmp_path / "f")


def test_unencodable_state_is_refused(tmp_path):
    ckpt = StateCheckpoint(tmp_path / "c")
    with pytest.raises(TypeError):
        ckpt.save({"x": object()})
    ckpt.close()


_SAVER = """
import sys
from afk_local.runner.run.state_checkpoint import StateCheckpoint
from afk_local.testing import kill_at_io_call
ckpt = StateCheckpoint(sys.argv[1])
start = (ckpt.load() or {"i": 0})["i"]
kill_at_io_call(int(sys.argv[2]))
for i in range(start + 1, start + 200):
    ckpt.save({"i": i, "check": i * 7, "pad": "p" * (i % 50)})
    print(i, flush=True)
"""


def test_crash_in_the_middle_of_save(tmp_path, trials):
    path = tmp_path / "c"
    acked_max = 0
    for _ in range(trials(8, 80)):
        done = proc.run(_SAVER, str(path), str(random.randint(1, 120)))
        printed = [int(x) for x in done.stdout.split()]
        if printed:
            acked_max = max(acked_max, printed[-1])
        state = StateCheckpoint(path).load()
        if state is None:
            assert acked_max == 0
            continue
        # a state some save() produced, never a torn mix, and nothing acknowledged lost
        assert state["check"] == state["i"] * 7 and state["pad"] == "p" * (state["i"] % 50)
        assert state["i"] >= acked_max
        acked_max = state["i"]


_NOTEBOOK_LOOP = """
import sys
import afk_local as afk
ckpt = afk.StateCheckpoint(sys.argv[1])
state = ckpt.load() or {"i": 0}
for i in range(state["i"], 5):
    state["i"] = i + 1
    ckpt.save(state)
print(state["i"])
"""


def test_every_checkpoint_damaged_is_an_error_not_a_restart(tmp_path):
    """The README's ``ckpt.load() or {...}`` must not silently start over on damage."""
    ckpt_dir = tmp_path / "c"
    first = proc.run(_NOTEBOOK_LOOP, str(ckpt_dir))
    assert first.returncode == 0 and first.stdout.split() == ["5"], first.stderr
    files = sorted((ckpt_dir / "runs" / "state").glob("*.ckpt"))
    assert files
    for file in files:  # a flipped byte in every checkpoint body
        data = bytearray(file.read_bytes())
        data[-1] ^= 0xFF
        file.write_bytes(bytes(data))

    again = proc.run(_NOTEBOOK_LOOP, str(ckpt_dir))
    assert again.returncode == 1
    last = again.stderr.strip().splitlines()[-1]
    assert "CheckpointCorruptionError" in last and files[-1].name in last
    assert f"afk-local verify state --root {ckpt_dir}" in last
    # the advised command works: it names the damaged files
    verify = proc.afk_local_cli({}, "verify", "state", "--root", str(ckpt_dir))
    assert verify.returncode == 1 and files[-1].name in verify.stdout + verify.stderr
    # starting over is a choice the caller makes explicitly
    assert StateCheckpoint(ckpt_dir).load(on_damage="fresh") is None
    with pytest.raises(ValueError, match="on_damage"):
        StateCheckpoint(ckpt_dir).load(on_damage="ignore")  # type: ignore[arg-type]


def test_an_int_msgpack_cannot_hold_is_named_by_its_path(tmp_path):
    ckpt = StateCheckpoint(tmp_path / "c")
    with pytest.raises(afk.UnstorableValueError, match=r"cannot store state\.a\.1: int 2361") as e:
        ckpt.save({"a": [1, 2**71]})
    assert "str(n) or decimal.Decimal(n)" in str(e.value)
    ckpt.save({"a": [1, str(2**71)]})  # as the message says
    assert ckpt.load() == {"a": [1, str(2**71)]}
    ckpt.close()
