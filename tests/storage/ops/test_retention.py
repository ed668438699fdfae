"""Retention and gc: what compaction keeps, that resume survives it, and kill -9 during it."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import cli_jobs
import proc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from proc import SUPPORT

import afk_local as afk
from afk_local.storage import fsio
from afk_local.storage.format.records import Effect
from afk_local.storage.ops.retention import (
    FileFacts,
    RetentionPolicy,
    plan_effects,
    plan_run,
    read_file_facts,
    runtime_state_count,
)
from afk_local.storage.store_identity import adopt_identity
from afk_local.testing import run_and_kill

TESTS = str(SUPPORT)


def _facts(phases: list[str], bases: list[int]) -> list[FileFacts]:
    return [
        FileFacts(seq, phase, f"{seq:012d}.{phase}.ckpt", base, 100)
        for seq, (phase, base) in enumerate(zip(phases, bases), start=1)
    ]


@st.composite
def runs(draw: st.DrawFn) -> list[FileFacts]:
    n = draw(st.integers(1, 60))
    phases = draw(
        st.lists(
            st.sampled_from(
                ["runtime_state", "step_started", "pre_llm", "paused", "run_started", "resumed"]
            ),
            min_size=n,
            max_size=n,
        )
    )
    deltas = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    bases = [seq - 1 if (delta and seq > 1) else 0 for seq, delta in enumerate(deltas, start=1)]
    return _facts(phases, bases)


@settings(max_examples=200, deadline=None)
@given(runs(), st.integers(0, 5), st.booleans())
def test_plan_keeps_what_resume_needs(files: list[FileFacts], keep: int, latest_step: bool) -> None:
    policy = RetentionPolicy(keep_runtime_states=keep, keep_latest_step=latest_step)
    plan = plan_run("r", files, policy)
    kept = {f.seq for f in plan.keep}
    rewritten = {f.seq for f in plan.rewrite}
    assert kept | {f.seq for f in plan.delete} == {f.seq for f in files}
    assert not kept & {f.seq for f in plan.delete}
    assert files[-1].seq in kept  # latest is never deleted
    states = [f.seq for f in files if f.phase == "runtime_state"]
    if states:
        assert states[-1] in kept  # the newest runtime_state: resume starts there
    # the cap applies: no more runtime_state rows than asked (the latest may add one)
    kept_states = [s for s in states if s in kept]
    latest_extra = files[-1].phase == "runtime_state" and files[-1].seq not in states[-keep:]
    if not latest_step:
        assert len(kept_states) <= max(1, keep) + latest_extra
    for f in files:
        if f.phase in ("paused", "run_started", "resumed"):
            assert f.seq in kept
    # every kept delta either has its base kept, or is rewritten as a keyframe
    for f in plan.keep:
        if f.base_seq:
            assert f.base_seq in kept or f.seq in rewritten


def test_plan_effects_keeps_newest_keys() -> None:
    records = []
    for i in range(10):
        records.append(Effect(kind="intent", key=f"k{i}", timestamp_ms=i))
        records.append(Effect(kind="outcome", key=f"k{i}", timestamp_ms=i, status="ok"))
    kept = plan_effects(records, 3)
    assert [r.key for r in kept] == ["k7", "k7", "k8", "k8", "k9", "k9"]
    assert plan_effects(records, None) == records
    assert plan_effects(records, 0) == []


def _chain_run(store: afk.Store, run_id: str, n: int, *, finish: bool = False) -> None:
    with store.create(run_id) as run:
        run.checkpoint("run_started", {"agent_name": "t"}, step=0)
        for i in range(n):
            run.checkpoint("runtime_state", {"i": i, "items": list(range(i % 40))}, step=i)
        if finish:
            run.finish({"n": n})


def test_compaction_rewrites_cut_deltas_and_resume_is_unchanged(tmp_path: Path) -> None:
    store = afk.Store(tmp_path)
    _chain_run(store, "r", 100)
    before = store.open("r").resume_state().checkpoint
    report = store.gc(RetentionPolicy(keep_runtime_states=3))
    assert not report.errors
    (compaction,) = report.compacted
    assert compaction.rewritten_files >= 1
    reader = store.open("r")
    assert runtime_state_count(reader.paths.dir) == 3
    assert [f.seq for f in reader.checkpoint_files()] == [1, 99, 100, 101]
    assert reader.resume_state().checkpoint == before
    assert reader.verify().ok
    with store.resume_writer("r") as run:  # the run continues after compaction
        run.checkpoint("runtime_state", {"i": 100}, step=100)
    assert store.open("r").latest().payload == {"i": 100}


@pytest.mark.parametrize("key", [None, "secret"])
def test_compaction_deletes_a_file_durably_before_what_it_depends_on(
    tmp_path: Path, key: str | None
) -> None:
    """Unlinks no directory fsync separates may reach the disk in any order: deleting a
    delta and its base (keyed: a checkpoint and its signed predecessor) under one fsync
    lets a crash keep the delta and lose its base, a damaged file to verify. Found by the
    crash-state explorer (afk_local.testing.crashsim, workloads gc and gc-keyed)."""
    store = afk.Store(tmp_path, key=key)
    with store.create("r") as run:
        for i in range(12):  # two interleaved delta chains: step_started and runtime_state
            run.checkpoint("step_started", {"state": "running", "message_count": i}, step=i)
            run.checkpoint("runtime_state", {"i": i, "items": list(range(i))}, step=i)
    reader = store.open("r")
    facts = {f.name: f for f in read_file_facts(reader.paths.dir, reader.checkpoint_files())}
    by_seq = {f.seq: f for f in facts.values()}
    calls: list[tuple[str, str]] = []
    previous = fsio.set_io_hook(lambda op, path: calls.append((op, path)))
    try:
        report = store.gc(RetentionPolicy(keep_runtime_states=1))
    finally:
        fsio.set_io_hook(previous)
    assert not report.errors
    unlinked = {os.path.basename(p): i for i, (op, p) in enumerate(calls) if op == "unlink"}
    run_dir = os.path.normpath(reader.paths.dir)
    syncs = [
        i for i, (op, p) in enumerate(calls) if op == "fsync" and os.path.normpath(p) == run_dir
    ]
    pairs = 0
    for name, at in unlinked.items():
        needs = [facts[name].base_seq] + ([facts[name].seq - 1] if key else [])
        for seq in needs:
            if seq in by_seq and by_seq[seq].name in unlinked:
                pairs += 1
                assert any(at < s < unlinked[by_seq[seq].name] for s in syncs), (name, seq)
    assert pairs >= 10
    assert store.open("r").verify().ok


def test_terminal_runs_beyond_limits_are_deleted_whole(tmp_path: Path) -> None:
    store = afk.Store(tmp_path)
    for i in range(4):
        _chain_run(store, f"done-{i}", 5, finish=True)
    _chain_run(store, "open-0", 5)  # interrupted: counted, never deleted
    report = store.gc(RetentionPolicy(max_runs=3), dry_run=True)
    assert report.deleted_runs == ["done-0", "done-1"]
    assert len(store.run_ids()) == 5  # dry run changed nothing
    report = store.gc(RetentionPolicy(max_runs=3))
    assert sorted(store.run_ids()) == ["done-2", "done-3", "open-0"]
    report = store.gc(RetentionPolicy(max_age_days=0, max_runs=0))
    assert store.run_ids() == ["open-0"]
    assert sorted(report.deleted_runs) == ["done-2", "done-3"]


def test_effects_cap_applies_to_terminal_runs_only(tmp_path: Path) -> None:
    store = afk.Store(tmp_path)
    for run_id, finish in (("done", True), ("open", False)):
        with store.create(run_id) as run:
            for i in range(20):
                run.effects.call(f"k{i}", lambda i=i: i)
                run.checkpoint("runtime_state", {"i": i}, step=i)
            if finish:
                run.finish(20)
    report = store.gc(RetentionPolicy(max_effects_per_run=5))
    dropped = {c.run_id: c.effects_dropped for c in report.compacted}
    assert dropped == {"done": 30, "open": 0}
    assert [e.key for e in store.open("done").effects()][::2] == [f"k{i}" for i in range(15, 20)]
    assert len(store.open("open").effects()) == 40
    assert store.open("done").verify().ok


def test_300_step_run_compacted_resumes_to_the_same_result(tmp_path: Path) -> None:
    store = afk.Store(tmp_path)
    job = cli_jobs.count_job.with_store(store)
    outside = str(tmp_path / "outside.txt")
    cli_jobs.FAIL_AT[:] = [200]
    with pytest.raises(RuntimeError, match="planned failure"):
        job.run(300, outside, run_id="big")
    assert store.read_meta("big").status.value == "failed"
    files_before = len(store.open("big").checkpoint_files())
    report = store.gc(RetentionPolicy())
    assert not report.errors
    reader = store.open("big")
    assert runtime_state_count(reader.paths.dir) <= 3
    assert len(reader.checkpoint_files()) < files_before // 20
    assert reader.verify().ok
    assert afk.resume("big", store=store) == cli_jobs.expected_total(300)
    lines = Path(outside).read_text().splitlines()
    assert sorted(int(line.split()[0]) for line in lines) == list(range(300))  # each once
    store.gc(RetentionPolicy(keep_runtime_states=0, max_effects_per_run=10))
    assert afk.resume("big", store=store) == cli_jobs.expected_total(300)  # stored result


HOLD_LOCK = """
import sys, time
import afk_local as afk
store = afk.Store(sys.argv[1])
run = store.resume_writer(sys.argv[2])
print("locked", flush=True)
time.sleep(60)
"""


def _tree(path: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(path)): (p.lstat().st_ino, p.lstat().st_size)
        for p in sorted(path.rglob("*"))
    }


def test_gc_never_touches_a_run_whose_lock_is_held(tmp_path: Path) -> None:
    store = afk.Store(tmp_path)
    _chain_run(store, "live", 50, finish=True)
    _chain_run(store, "idle", 50)
    child = proc.spawn(HOLD_LOCK, str(tmp_path), "live")
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "locked"
        before = _tree(store.paths("live").dir)
        report = store.gc(RetentionPolicy(keep_runtime_states=1, max_runs=0, max_age_days=0))
        assert report.skipped_locked == ["live"]
        assert _tree(store.paths("live").dir) == before
        assert len(store.open("idle").checkpoint_files()) < 50  # the free run was compacted
    finally:
        child.kill()
        child.wait()


GC_CHILD = """
import sys
import afk_local as afk
from afk_local.storage.ops.retention import RetentionPolicy
from afk_local.testing import kill_at_io_call
switch = kill_at_io_call(int(sys.argv[2]))
afk.Store(sys.argv[1]).gc(RetentionPolicy(keep_runtime_states=2, max_runs=4,
                                          max_effects_per_run=3))
print("done", switch.calls, flush=True)
"""


def _build_gc_template(root: Path) -> dict[str, object]:
    store = afk.Store(root)
    for i in range(2):
        _chain_run(store, f"old-{i}", 30, finish=True)  # deleted whole (max_runs)
    _chain_run(store, "open", 40)  # interrupted, chained deltas: rewrites happen
    with store.create("effects") as run:
        for i in range(10):
            run.effects.call(f"k{i}", lambda i=i: i)
            run.checkpoint("runtime_state", {"i": i}, step=i)
        run.finish(10)
    with store.create("paused") as run:
        for i in range(20):
            run.checkpoint("runtime_state", {"i": i}, step=i)
        run.pause("input", "why?")
    return {run_id: store.open(run_id).resume_state() for run_id in store.run_ids()}


def test_kill_9_during_gc_leaves_every_run_resumable(tmp_path: Path, trials) -> None:
    template = tmp_path / "template"
    expected = _build_gc_template(template)
    counting = tmp_path / "count"
    shutil.copytree(template, counting, symlinks=True)
    ops: list[int] = []
    previous = fsio.set_io_hook(lambda op, path: ops.append(1))
    try:
        afk.Store(counting).gc(RetentionPolicy(keep_runtime_states=2, max_runs=4,
                                               max_effects_per_run=3))  # fmt: skip
    finally:
        fsio.set_io_hook(previous)
    assert len(ops) > 20
    rng = random.Random(7)
    for trial in range(trials(20, 200)):
        root = tmp_path / f"trial-{trial}"
        shutil.copytree(template, root, symlinks=True)
        adopt_identity(root, None)  # a copy: its runs continue only once it is adopted
        kill_at = rng.randint(1, len(ops))
        result = proc.run(GC_CHILD, str(root), str(kill_at))
        assert result.returncode == -9, (kill_at, result.stderr)
        store = afk.Store(root)
        remaining = store.run_ids()
        assert {"open", "effects", "paused"} <= set(remaining), (kill_at, remaining)
        for run_id in remaining:
            reader = store.open(run_id)
            report = reader.verify()
            assert report.ok, (kill_at, run_id, report.problems)
            state = reader.resume_state()
            want = expected[run_id]
            assert (state.terminal, state.result) == (want.terminal, want.result), kill_at
            assert state.state == want.state, (kill_at, run_id)
            if run_id == "effects":
                keys = [e.key for e in reader.effects()]
                assert keys in ([f"k{i}" for i in range(10) for _ in (0, 1)],
                                [f"k{i}" for i in range(7, 10) for _ in (0, 1)])  # fmt: skip
        with store.resume_writer("open") as run:  # still writable after the crash
            run.checkpoint("runtime_state", {"i": 40}, step=40)
        # a second gc (no crash) finishes the job
        assert not store.gc(RetentionPolicy(keep_runtime_states=2, max_runs=4)).errors
        assert not [p for p in os.listdir(store.runs_dir) if p.startswith(fsio.TEMP_PREFIX)]


def _afk_cli(root: Path, *args: str) -> None:
    """Run ``afk-local ARGS --root ROOT`` in its own process; it must succeed."""
    done = proc.run(
        "import sys; from afk_local.cli.main import main; sys.exit(main(sys.argv[1:]))",
        *args,
        "--root",
        str(root),
        env={"PYTHONPATH": TESTS},
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_gc_never_takes_a_failed_runs_retry_away(tmp_path: Path) -> None:
    """A failed run is resumable: gc keeps its journal and the run, its retry repeats nothing.

    One gc with every policy that could cost it: trim the journal to nothing, keep no
    run, keep nothing older than now.
    """
    store = afk.Store(tmp_path / "store")
    charges, flag = tmp_path / "charges.txt", tmp_path / "down"
    job = cli_jobs.charges_then_failure
    first = run_and_kill(job, str(charges), str(flag), at=None, store=store, run_id="pay")
    assert first.returncode != 0 and "shipping service is down" in first.stderr, first.stderr
    assert store.read_meta("pay").status is afk.RunStatus.FAILED

    policy = ["--max-effects-per-run", "0", "--max-runs", "0", "--max-age-days", "0"]
    _afk_cli(store.root, "gc", *policy)

    retry = run_and_kill(job, str(charges), str(flag), at=None, store=store, run_id="pay")
    assert retry.returncode == 0, retry.stderr
    assert store.read_meta("pay").status is afk.RunStatus.COMPLETED
    assert charges.read_text().splitlines() == [f"charge {n}" for n in range(1, 5)]
