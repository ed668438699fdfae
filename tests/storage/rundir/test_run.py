"""Run directories: writing, reading, latest fallback, verify, ids, locks, permissions."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest
from frames import huge_declared_frame
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import payloads

import afk_local as afk
from afk_local.storage import fsio
from afk_local.storage.format import codec
from afk_local.storage.format.records import RunStatus


@pytest.fixture
def store(tmp_path: Path) -> afk.Store:
    return afk.Store(tmp_path / "store")


def _write_run(store: afk.Store, run_id: str, n: int) -> list[dict[str, object]]:
    written = []
    with store.create(run_id) as run:
        for i in range(1, n + 1):
            payload = {"i": i, "messages": [f"message {j} " * 10 for j in range(i)]}
            run.checkpoint("runtime_state", payload, step=i)
            written.append(payload)
    return written


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(payloads, min_size=1, max_size=6))
def test_any_payload_round_trips_through_a_run(tmp_path: Path, values: list[object]) -> None:
    store = afk.Store(tmp_path / f"s{os.urandom(4).hex()}")
    with store.create("r") as run:
        for i, value in enumerate(values, 1):
            run.checkpoint("runtime_state", value, step=i)
    reader = store.open("r")
    assert [c.payload for c in reader.history()] == values
    assert reader.latest().payload == values[-1]


def test_history_mixes_keyframes_and_deltas(store: afk.Store) -> None:
    written = _write_run(store, "r", 80)
    reader = store.open("r")
    assert [c.payload for c in reader.history()] == written
    flags = [
        codec.unpack_frame((reader.paths.dir / f.name).read_bytes(), f.name, expect_kind=1)[
            0
        ].is_delta
        for f in reader.checkpoint_files()
    ]
    assert not flags[0]
    assert sum(flags) > 60  # mostly deltas
    assert flags.count(False) >= 3  # chains are bounded (max_chain=32)
    # A fresh reader decodes the last checkpoint from its keyframe.
    assert afk.Store(store.root).open("r").get(80).payload == written[-1]


def test_resume_writer_starts_a_new_keyframe_and_continues_seq(store: afk.Store) -> None:
    _write_run(store, "r", 3)
    with store.resume_writer("r") as run:
        record = run.checkpoint("runtime_state", {"i": 4}, step=4)
        assert record.seq == 4
        assert run.meta.attempt == 2
    data = (store.paths("r").dir / "000000000004.runtime_state.ckpt").read_bytes()
    assert not codec.unpack_frame(data, "f", expect_kind=1)[0].is_delta


def test_status_follows_writes(store: afk.Store) -> None:
    with store.create("r") as run:
        assert run.meta.status is RunStatus.CREATED
        run.checkpoint("step_started", {}, step=1)
        assert store.read_meta("r").status is RunStatus.RUNNING
        run.pause("approval", {"question": "ok?"})
        assert store.read_meta("r").status is RunStatus.PAUSED
        assert store.read_meta("r").pause.prompt == {"question": "ok?"}
        run.checkpoint("resumed", {"kind": "approval"}, step=1)
        assert store.read_meta("r").status is RunStatus.RUNNING
        run.finish({"answer": 42})
    reader = store.open("r")
    assert reader.meta.status is RunStatus.COMPLETED
    state = reader.resume_state()
    assert state.terminal and state.result == {"answer": 42}


def test_fail_records_error_and_resume_state_returns_last_runtime_state(store: afk.Store) -> None:
    with store.create("r") as run:
        run.checkpoint("runtime_state", {"n": 1}, step=1)
        run.checkpoint("step_started", {}, step=2)
        try:
            raise RuntimeError("boom")
        except RuntimeError as exc:
            run.fail(exc)
    reader = store.open("r")
    assert reader.meta.status is RunStatus.FAILED
    assert reader.meta.error.type == "RuntimeError" and "boom" in reader.meta.error.traceback
    state = reader.resume_state()
    assert not state.terminal and state.state == {"n": 1}


def _flip(path: Path, pos: int) -> None:
    data = bytearray(path.read_bytes())
    data[pos % len(data)] ^= 0x40
    os.chmod(path, 0o600)
    path.write_bytes(bytes(data))


def test_corrupt_latest_falls_back_to_newest_valid_and_verify_names_it(store: afk.Store) -> None:
    written = _write_run(store, "r", 5)
    newest = store.paths("r").checkpoint(5, "runtime_state")
    _flip(newest, 40)
    reader = store.open("r")
    with pytest.raises(afk.CheckpointCorruptionError) as excinfo:
        reader.get(5)
    assert str(newest) in str(excinfo.value) and "afk-local verify r" in str(excinfo.value)
    latest = reader.latest()
    assert latest.seq == 4 and latest.payload == written[3]
    assert [s.name for s in reader.skipped] == [newest.name]
    report = reader.verify()
    assert not report.ok
    assert [p.path for p in report.problems] == [str(newest)]


def test_corrupt_base_breaks_its_dependent_deltas_but_not_older_files(store: afk.Store) -> None:
    written = _write_run(store, "r", 6)
    _flip(store.paths("r").checkpoint(3, "runtime_state"), 30)
    reader = store.open("r")
    assert reader.latest().seq == 2  # 4..6 are deltas chained through 3
    assert reader.latest().payload == written[1]
    assert {Path(p.path).name[:12] for p in reader.verify().problems} == {
        f"{i:012d}" for i in (3, 4, 5, 6)
    }


@pytest.mark.parametrize(
    "target",
    [
        "../other/000000000001.runtime_state.ckpt",
        "/etc/passwd",
        "run.meta",
        "000000000009.runtime_state.ckpt",  # dangling
        "000000000001.runtime_state.ckpt/../../x",
    ],
)
def test_unsound_latest_is_ignored(store: afk.Store, target: str) -> None:
    written = _write_run(store, "r", 2)
    other = _write_run(store, "other", 1)
    assert other
    latest = store.paths("r").latest
    os.unlink(latest)
    os.symlink(target, latest)
    reader = store.open("r")
    assert reader.latest().payload == written[-1]
    assert reader.skipped or target.startswith("000000000009")


def test_latest_as_pointer_file_is_accepted(store: afk.Store) -> None:
    written = _write_run(store, "r", 3)
    latest = store.paths("r").latest
    os.unlink(latest)
    latest.write_text("000000000002.runtime_state.ckpt")
    assert store.open("r").latest().payload == written[1]


def test_missing_latest_scans(store: afk.Store) -> None:
    written = _write_run(store, "r", 3)
    os.unlink(store.paths("r").latest)
    assert store.open("r").latest().payload == written[2]


@pytest.mark.parametrize("bad", ["../x", "a/b", "", "x" * 200, "\x00", ".", "..", "-a", "a\n", "é"])
def test_bad_run_ids_are_refused_before_any_path_is_built(store: afk.Store, bad: str) -> None:
    with pytest.raises(afk.InvalidRunIdError):
        store.create(bad)
    with pytest.raises(afk.InvalidRunIdError):
        store.open(bad)
    with pytest.raises(afk.InvalidRunIdError):
        store.resume_writer(bad)
    assert not store.root.exists() or not any(store.runs_dir.iterdir())


def test_crafted_huge_checkpoint_is_refused(store: afk.Store) -> None:
    written = _write_run(store, "r", 1)
    body = huge_declared_frame(100 << 30)
    path = store.paths("r").checkpoint(2, "runtime_state")
    path.write_bytes(codec.pack_frame(codec.KIND_CHECKPOINT, body))
    os.unlink(store.paths("r").latest)
    os.symlink(path.name, store.paths("r").latest)
    reader = store.open("r")
    assert reader.latest().payload == written[0]
    assert "max_record_bytes" in reader.skipped[0].reason


def test_permissions_are_private(store: afk.Store) -> None:
    old = os.umask(0)
    try:
        _write_run(store, "r", 2)
    finally:
        os.umask(old)
    run_dir = store.paths("r").dir
    for path in [store.root, store.runs_dir, run_dir]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    for path in run_dir.iterdir():
        if path.is_symlink():
            continue
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_second_writer_in_same_process_is_refused(store: afk.Store) -> None:
    with store.create("r"):
        with pytest.raises(afk.RunLockedError, match="is being written"):
            store.resume_writer("r")
        assert store.owner_alive("r")
        with pytest.raises(afk.RunLockedError):
            store.delete("r")
    assert not store.owner_alive("r")
    assert store.paths("r").lock.exists()  # never deleted


def test_create_refuses_existing_and_open_refuses_missing(store: afk.Store) -> None:
    _write_run(store, "r", 1)
    with pytest.raises(afk.RunExistsError):
        store.create("r")
    with pytest.raises(afk.RunNotFoundError, match="afk-local runs"):
        store.open("nope")
    with pytest.raises(afk.RunNotFoundError):
        store.resume_writer("nope")


def test_runs_lists_and_delete_removes(store: afk.Store) -> None:
    _write_run(store, "a", 2)
    with store.create("b") as run:
        run.finish("done")
    infos = {i.run_id: i for i in store.runs()}
    assert infos["a"].status is RunStatus.RUNNING and infos["a"].interrupted
    assert infos["a"].step == 2 and infos["a"].seq == 2 and infos["a"].bytes > 0
    assert infos["b"].status is RunStatus.COMPLETED and not infos["b"].interrupted
    assert [i.run_id for i in store.runs(status="completed")] == ["b"]
    assert store.interrupted() == ["a"]
    store.delete("a")
    assert store.run_ids() == ["b"]
    assert not any(p.name.startswith(fsio.TEMP_PREFIX) for p in store.runs_dir.iterdir())


def test_stray_temp_files_are_removed_on_reopen(store: afk.Store) -> None:
    _write_run(store, "r", 1)
    stray = store.paths("r").dir / ".tmp-000000000002.runtime_state.ckpt.1.abcd"
    stray.write_bytes(b"partial")
    assert any("temp" in n for n in store.open("r").verify().notes)
    with store.resume_writer("r"):
        pass
    assert not stray.exists()


def test_unencodable_payload_fails_before_any_io(store: afk.Store) -> None:
    with store.create("r") as run:
        with pytest.raises(TypeError):
            run.checkpoint("runtime_state", {"x": object()}, step=1)
        run.checkpoint("runtime_state", {"x": 1}, step=1)  # the writer is still usable
    assert store.open("r").latest().seq == 1


def test_custom_types_through_hooks(tmp_path: Path) -> None:
    class Money:
        def __init__(self, cents: int) -> None:
            self.cents = cents

    def enc(obj: object) -> object:
        if isinstance(obj, Money):
            return {"__money__": obj.cents}
        raise NotImplementedError

    store = afk.Store(tmp_path, enc_hook=enc)
    with store.create("r") as run:
        run.checkpoint("runtime_state", {"price": Money(110)}, step=1)
    assert store.open("r").latest().payload == {"price": {"__money__": 110}}


def test_delta_base_is_the_newest_checkpoint_of_the_same_phase(store: afk.Store) -> None:
    # A large snapshot after each tiny phase payload must still be a small delta.
    snapshot: dict[str, object] = {"messages": []}
    with store.create("r") as run:
        for step in range(1, 11):
            run.checkpoint("step_started", {"state": "running", "message_count": step}, step=step)
            snapshot["messages"].append(f"message {step} " * 50)  # type: ignore[union-attr]
            run.checkpoint("runtime_state", snapshot, step=step)
    reader = afk.Store(store.root).open("r")
    headers = {
        f.seq: codec.unpack_frame((reader.paths.dir / f.name).read_bytes(), f.name, expect_kind=1)[
            0
        ]
        for f in reader.checkpoint_files()
    }
    assert headers[4].base_seq == 2 and headers[20].base_seq == 18
    assert headers[3].base_seq == 1
    assert reader.latest().payload == snapshot
    assert [c.payload for c in reader.history()][-1] == snapshot
    assert reader.verify().ok


@pytest.mark.parametrize("key", [None, "secret"])
def test_threads_that_first_use_effects_together_share_one_journal(
    tmp_path: Path, key: str | None
) -> None:
    """A second Journal on effects.log skipped the directory fsync its creator had not made
    yet (an effect could run with its intent in a file a power cut loses: found by the
    crash-state explorer's async workload) and appended with its own offsets and, keyed,
    its own signature chain (the journal then read as corrupt)."""
    store = afk.Store(tmp_path, key=key)
    for attempt in range(3):
        run_id = f"r{attempt}"
        with store.create(run_id) as run:
            barrier = threading.Barrier(8)
            journals: list[object] = []
            results: dict[int, object] = {}

            def call(
                i: int, run: afk.RunWriter = run, barrier: threading.Barrier = barrier
            ) -> None:
                barrier.wait()
                journals.append(run.effects)
                results[i] = run.effects.call(f"k{i}", lambda i=i: {"v": i})

            threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert len({id(j) for j in journals}) == 1
            assert results == {i: {"v": i} for i in range(8)}
        reader = store.open(run_id)
        assert reader.verify().ok, reader.verify().problems
        assert sorted(e.key for e in reader.effects() if e.kind == "outcome") == [
            f"k{i}" for i in range(8)
        ]
