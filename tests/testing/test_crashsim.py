"""The crash-state explorer: every state it builds recovers, and every mutant is caught.

The composed rewrite workloads, crashing twice and the site mutants are in
test_crashsim_rewrites.py. The default run explores each single-operation workload
with the default budget (today that is every distinct state) and every kind mutant on
every one of them; ``--torture`` explores
every state with no budget and records the async workload many times (its threads
interleave differently on each recording, so its traces differ).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from afk_local.testing.crashsim import (
    DEFAULT_MAX_STATES,
    MUTANTS,
    WORKLOADS,
    Workload,
    explore,
    explorer,
)
from afk_local.testing.crashsim.__main__ import main
from afk_local.testing.crashsim.disk import DIR, FILE, Node, read_tree, write_tree
from afk_local.testing.crashsim.model import PAGE_SIZE, DiskModel, content_candidates
from afk_local.testing.crashsim.report import counterexample_text
from afk_local.testing.crashsim.trace import Op, RecordingError
from afk_local.testing.crashsim.workloads import BASIC_WORKLOADS, continue_run


@pytest.mark.parametrize("workload", [w.name for w in BASIC_WORKLOADS])
def test_every_crash_state_of_every_workload_recovers(workload: str, full: bool) -> None:
    result = explore(workload, max_states=None if full else DEFAULT_MAX_STATES, seed=1)
    found = result.counterexample
    assert found is None, counterexample_text(found)
    assert result.calls >= 15
    assert result.crash_points == result.calls + 1
    assert result.states >= 4  # distinct trees; most crash points leave the same few


def test_async_workload_recovers_under_many_thread_interleavings(trials) -> None:
    for _ in range(trials(1, 12)):  # each recording interleaves its threads anew
        result = explore("async", max_states=None)
        assert result.ok, counterexample_text(result.counterexample)  # type: ignore[arg-type]


@pytest.mark.parametrize("mutant", list(MUTANTS))
def test_each_mutant_is_caught_wherever_it_removes_an_fsync(mutant: str, full: bool) -> None:
    applied = 0
    for workload in (w.name for w in BASIC_WORKLOADS):
        result = explore(workload, mutant=mutant, max_states=None if full else DEFAULT_MAX_STATES)
        if result.removed == 0:  # this workload makes no fsync of that kind
            assert result.ok
            continue
        applied += 1
        found = result.counterexample
        assert found is not None, f"{mutant} not caught in {workload} ({result.states} states)"
        assert found.mutant == mutant and found.workload == workload
        assert 1 <= found.call <= result.calls
        assert found.op.startswith(f"#{found.call} ")
        assert found.lost  # what the crash dropped
        assert found.problems  # what a new process found lost or broken
        assert found.ignored  # the fsyncs the mutant removed before the crash
    assert applied >= 2


def test_mutant_counterexamples_name_what_was_lost() -> None:
    by_dir = explore("sync", mutant="no-dir-fsync").counterexample
    assert by_dir is not None
    assert any("is missing" in p for p in by_dir.problems)
    assert any(line.startswith("dropped #") for line in by_dir.lost)
    by_journal = explore("journal", mutant="no-journal-fsync").counterexample
    assert by_journal is not None
    assert any("effects.log" in p for p in by_journal.problems)
    assert any("bytes survived" in line for line in by_journal.lost)
    by_file = explore("gc", mutant="no-file-fsync").counterexample
    assert by_file is not None
    text = counterexample_text(by_file)
    assert "COUNTEREXAMPLE in workload gc, mutant no-file-fsync" in text
    assert f"crash right after call #{by_file.call}" in text


# -- the model ----------------------------------------------------------------------------


def _op(index: int, operation: str, path: str, **fields: object) -> Op:
    return Op(index, operation, path, **fields)  # type: ignore[arg-type]


def test_unsynced_file_data_survives_as_a_page_aligned_prefix() -> None:
    synced, current = b"a" * 100, b"a" * 100 + b"b" * (2 * PAGE_SIZE + 10)
    options = content_candidates(synced, current)
    assert options[0] == synced and options[-1] == current
    assert [len(o) for o in options] == [100, PAGE_SIZE, 2 * PAGE_SIZE, len(current)]
    assert content_candidates(current, current) == (current,)


def test_unsynced_directory_operations_persist_in_any_subset_renames_whole() -> None:
    model = DiskModel({"d": Node(DIR)})
    calls = [
        _op(1, "open", "d/tmp"),
        _op(2, "write", "d/tmp", data=b"new"),
        _op(3, "fsync", "d/tmp"),
        _op(4, "rename", "d/name", source="d/tmp"),
        _op(5, "open", "d/later"),
    ]
    for call in calls:
        model.apply(call)
    frontier = model.frontier(5, calls[-1])
    assert frontier.combinations == 8  # three pending changes of d
    states = {tuple(sorted(frontier.tree(frontier.choice(i)))) for i in range(8)}
    assert ("d", "d/later") in states  # the later create persisted, the rename did not
    assert all(not {"d/tmp", "d/name"} <= set(s) for s in states)  # a rename is whole
    kept_all = frontier.tree(frontier.choice(7))
    assert kept_all["d/name"] == Node(FILE, data=b"new", inode=kept_all["d/name"].inode)
    model.apply(_op(6, "fsync", "d"))
    after = model.frontier(6)
    assert after.combinations == 1
    assert sorted(after.tree(after.choice(0))) == ["d", "d/later", "d/name"]


def test_a_mutant_treats_its_kind_of_fsync_as_never_made() -> None:
    calls = [_op(1, "open", "f"), _op(2, "write", "f", data=b"x"), _op(3, "fsync", "f")]
    for ignored, combinations in ((frozenset(), 2), (frozenset({"file"}), 4)):
        model = DiskModel({}, ignored_fsyncs=ignored)
        for call in calls:
            model.apply(call)
        assert model.frontier(3).combinations == combinations  # the create is never synced
    with pytest.raises(ValueError, match="unknown fsync kinds"):
        DiskModel({}, ignored_fsyncs=frozenset({"everything"}))


def test_trees_round_trip_through_disk_with_hard_links(tmp_path: Path) -> None:
    tree = {
        "a": Node(DIR),
        "a/f": Node(FILE, data=b"data", inode=1),
        "a/g": Node(FILE, data=b"data", inode=1),
        "a/link": Node("symlink", target="f"),
    }
    write_tree(tree, tmp_path / "t")
    assert os.stat(tmp_path / "t/a/f").st_ino == os.stat(tmp_path / "t/a/g").st_ino
    again = read_tree(tmp_path / "t")
    assert {p: (n.kind, n.data, n.target) for p, n in again.items()} == {
        p: (n.kind, n.data, n.target) for p, n in tree.items()
    }


def test_a_write_that_bypasses_fsio_makes_the_recording_fail() -> None:
    def record(session, _prepared) -> None:  # type: ignore[no-untyped-def]
        with session.store.create("r") as run:
            run.checkpoint("runtime_state", {"i": 1}, step=1)
            with open(run.paths.dir / "sneaky", "wb") as fh:  # not through fsio
                fh.write(b"x")

    sneaky = Workload("sneaky", "writes behind fsio's back", record, lambda s: {}, {})
    with pytest.raises(RecordingError, match="sneaky: on disk, not in the model"):
        explore(sneaky)


def test_continue_run_reopens_and_checkpoints(tmp_path: Path) -> None:
    store = WORKLOADS["fork"].store(tmp_path)
    with store.create("r") as run:
        run.checkpoint("runtime_state", {"i": 1}, step=1)
    assert continue_run(store, "r") == "resumed"
    assert store.open("r").latest().payload == {"resumed_after": 1}  # type: ignore[union-attr]
    with store.resume_writer("r") as run:
        run.finish("done")
    assert continue_run(store, "r") == {"completed": "done"}


# -- the command line -----------------------------------------------------------------------


def test_command_line_exit_codes_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--workload", "fork", "--max-states", "10"]) == 0
    assert "fork" in capsys.readouterr().out
    assert main(["--workload", "sync", "--mutant", "no-dir-fsync", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False
    (result,) = doc["explorations"]
    found = result["counterexample"]
    assert found["call"] >= 1 and found["lost"] and found["problems"]
    with pytest.raises(SystemExit) as usage:
        main(["--mutant", "no-such-mutant"])
    assert usage.value.code == 2


def test_python_dash_m_entry_point_reports_a_counterexample() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "afk_local.testing.crashsim",
            "--workload",
            "journal",
            "--mutant",
            "no-journal-fsync",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    assert "COUNTEREXAMPLE in workload journal, mutant no-journal-fsync" in proc.stdout
    assert "a new process found:" in proc.stdout


def test_the_scratch_directory_is_in_memory_only_with_room(monkeypatch) -> None:
    """A container's /dev/shm is often 64 MiB: the explorer (and the fuzzer) would run out
    of space there, not find a bug, so they take the system's temp directory instead."""
    if not (os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK | os.X_OK)):
        pytest.skip("no writable /dev/shm here")
    small = SimpleNamespace(f_bavail=64 << 10, f_frsize=1024)  # 64 MiB free
    monkeypatch.setattr(os, "statvfs", lambda path: small)
    assert explorer.scratch_root() is None
    roomy = SimpleNamespace(f_bavail=explorer.SCRATCH_MIN_FREE_BYTES // 1024, f_frsize=1024)
    monkeypatch.setattr(os, "statvfs", lambda path: roomy)
    assert explorer.scratch_root() == "/dev/shm"
