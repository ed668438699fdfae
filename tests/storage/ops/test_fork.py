"""Forks: a new run sharing a source's history up to a checkpoint, resumable on its own."""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

import cli_jobs
import proc
import pytest

import afk_local as afk
from afk_local.storage.ops.retention import STALE_BUILD_SECONDS, RetentionPolicy

N = 20
FORK_AFTER = 8  # items done at the fork point


def _snapshot(path: Path) -> dict[str, str]:
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
        if p.is_file() and not p.is_symlink()
        else str(p.readlink() if p.is_symlink() else "dir")
        for p in sorted(path.rglob("*"))
    }


def _seq_after_items(reader: afk.RunReader, items: int) -> int:
    for record in reader.history():
        payload = record.payload if isinstance(record.payload, dict) else {}
        cursor = payload.get("cursors", {}).get("iterate#1", {})
        if record.phase == "runtime_state" and cursor.get("n") == items:
            return record.seq
    raise AssertionError(f"no runtime_state after {items} items")


@pytest.fixture
def source(tmp_path: Path) -> tuple[afk.Store, Path]:
    store = afk.Store(tmp_path / "store")
    outside = tmp_path / "outside.txt"
    assert cli_jobs.count_job.with_store(store).run(N, str(outside), run_id="src") == (
        cli_jobs.expected_total(N)
    )
    return store, outside


def test_fork_at_a_middle_seq_then_resume(source: tuple[afk.Store, Path]) -> None:
    store, outside = source
    src_dir = store.paths("src").dir
    before = _snapshot(src_dir)
    at = _seq_after_items(store.open("src"), FORK_AFTER)

    info = store.fork("src", at, "fork")
    assert info.run_id == "fork" and info.seq == at and info.parent_run_id == "src"
    meta = store.read_meta("fork")
    assert meta.extra["forked_from"] == "src" and meta.extra["at_seq"] == at
    assert meta.status is afk.RunStatus.CREATED
    fork = store.open("fork")
    assert [f.seq for f in fork.checkpoint_files()] == list(range(1, at + 1))
    assert fork.verify().ok
    # history is shared, not copied: same inodes
    name = fork.checkpoint_files()[0].name
    assert (src_dir / name).stat().st_ino == (fork.paths.dir / name).stat().st_ino
    # the fork's journal holds the effects recorded up to the fork point
    keys = {e.key for e in fork.effects() if e.kind == "outcome"}
    assert keys == {f"iterate#1[{i}]/append#1" for i in range(FORK_AFTER)}

    assert afk.resume("fork", store=store) == cli_jobs.expected_total(N)
    assert store.read_meta("fork").status is afk.RunStatus.COMPLETED
    assert _snapshot(src_dir) == before  # the source is untouched
    # items before the fork were not executed again; the rest ran once, in the fork
    lines = [line.split() for line in outside.read_text().splitlines()]
    by_run: dict[int, int] = {}
    for item, _key in lines:
        by_run[int(item)] = by_run.get(int(item), 0) + 1
    assert all(by_run[i] == 1 for i in range(FORK_AFTER))  # replayed in the fork, not re-run
    assert all(by_run[i] == 2 for i in range(FORK_AFTER, N))  # once in src, once in the fork
    outcomes = [e for e in store.open("fork").effects() if e.kind == "outcome"]
    assert len(outcomes) == N


def test_fork_survives_compaction_of_its_source(source: tuple[afk.Store, Path]) -> None:
    store, _ = source
    at = _seq_after_items(store.open("src"), FORK_AFTER)
    store.fork("src", at, "fork")
    expected = store.open("fork").resume_state().checkpoint
    store.gc(RetentionPolicy(keep_runtime_states=1))
    assert store.open("fork").resume_state().checkpoint is not None
    store.gc(RetentionPolicy(keep_runtime_states=1))
    reader = store.open("fork")
    assert reader.verify().ok
    assert reader.resume_state().checkpoint == expected


def test_fork_refuses_bad_requests(source: tuple[afk.Store, Path]) -> None:
    store, _ = source
    with pytest.raises(afk.CheckpointNotFoundError):
        store.fork("src", 10_000)
    with pytest.raises(afk.RunNotFoundError):
        store.fork("nope", 1)
    with pytest.raises(afk.InvalidRunIdError):
        store.fork("src", 2, "../evil")
    store.fork("src", 2, "taken")
    with pytest.raises(afk.RunExistsError):
        store.fork("src", 3, "taken")
    assert sorted(store.run_ids()) == ["src", "taken"]
    assert store.fork("src", 3).run_id not in ("src", "taken")  # a fresh id by default


# The child forks (or imports) with a SIGKILL at its N-th durable I/O call.
PUBLISH_CHILD = r"""
import json, sys, afk_local as afk
from afk_local.storage.ops.export import export_records, import_run, to_jsonable
from afk_local.testing import kill_at_io_call
root, what, kill_at, at_seq = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
store = afk.Store(root)
text = "\n".join(json.dumps(to_jsonable(r)) for r in export_records(store.open("src")))
switch = kill_at_io_call(kill_at)
if what == "fork":
    store.fork("src", at_seq, "f")
else:
    import_run(store, text, new_run_id="f")
print("calls", switch.calls, flush=True)
"""


@pytest.mark.parametrize("what", ["fork", "import"])
def test_sigkill_during_fork_or_import_never_leaves_a_half_made_run(
    source: tuple[afk.Store, Path], tmp_path: Path, trials, what: str
) -> None:
    """Both build the new run under a temp name and publish it by one rename."""
    store, _ = source
    at = _seq_after_items(store.open("src"), FORK_AFTER)
    template = store.root
    counting = tmp_path / "counting"
    shutil.copytree(template, counting, symlinks=True)
    done = proc.run(PUBLISH_CHILD, str(counting), what, "0", str(at))
    assert done.returncode == 0, done.stderr
    total = int(done.stdout.split()[-1])
    assert total > 5
    expected = [c.payload for c in afk.Store(counting).open("f").history()]
    rng = random.Random(7)
    # a random sample (every call with --torture), always with the last call: killed
    # after the publishing rename, the run must be there and whole
    points = sorted({total, *rng.sample(range(1, total + 1), min(trials(8, 10**6), total))})
    published = 0
    for kill_at in points:
        root = tmp_path / f"{what}-{kill_at}"
        shutil.copytree(template, root, symlinks=True)
        before = _snapshot(root / "runs" / "src")
        result = proc.run(PUBLISH_CHILD, str(root), what, str(kill_at), str(at))
        assert result.returncode == -9, (kill_at, result.stderr)
        crashed = afk.Store(root)
        assert _snapshot(root / "runs" / "src") == before, kill_at
        if (root / "runs" / "f").exists():  # published: then it is whole
            published += 1
            fork = crashed.open("f")
            assert fork.verify().ok, (kill_at, fork.verify().problems)
            assert [c.payload for c in fork.history()] == expected, kill_at
        # What the crash left under a temp name: gc spares it while it could still be
        # a build in progress, and removes it once it is stale.
        temps = [p for p in (root / "runs").iterdir() if p.name.startswith(".tmp-")]
        crashed.gc(RetentionPolicy(keep_runtime_states=10**6))
        assert all(p.exists() for p in temps), kill_at
        stale = time.time() - STALE_BUILD_SECONDS - 60
        for path in temps:
            os.utime(path, (stale, stale))
        crashed.gc(RetentionPolicy(keep_runtime_states=10**6))
        leftovers = [p.name for p in (root / "runs").iterdir() if p.name.startswith(".tmp-")]
        assert leftovers == [], (kill_at, leftovers)
    assert published >= 1  # the whole-run branch was exercised


# A run that journals one effect right after each checkpoint, with that checkpoint's step
# (as the agent protocol does: a post_llm checkpoint, then the tool calls of that step).
# With "step-back" the wall clock steps back 5 s halfway (NTP, a VM resumed).
JOURNALING_CHILD = r"""
import sys, time, afk_local as afk
root, n, clock = sys.argv[1], int(sys.argv[2]), sys.argv[3]
store = afk.Store(root)
real_time_ns = time.time_ns
with store.create("src") as run:
    for i in range(1, n + 1):
        if clock == "step-back" and i == n // 2:
            time.time_ns = lambda: real_time_ns() - 5_000_000_000
        run.checkpoint("runtime_state", {"i": i}, step=i)
        run.effects.call(f"tool-{i}", lambda i=i: i, step=i)
print("done", flush=True)
"""


@pytest.mark.parametrize("clock", ["steady", "step-back"])
def test_fork_inherits_exactly_the_effects_journaled_before_its_checkpoint(
    tmp_path: Path, clock: str
) -> None:
    """Selected by journal position, never by time: same-millisecond effects and a clock
    stepped back leak nothing from after the fork point into the fork."""
    shm = Path("/dev/shm")
    base = Path(tempfile.mkdtemp(dir=shm)) if shm.is_dir() else tmp_path
    try:
        n = 60
        done = proc.run(JOURNALING_CHILD, str(base / "store"), str(n), clock)
        assert done.returncode == 0, done.stderr
        store = afk.Store(base / "store")
        wrong = {}
        for seq in range(1, n + 1):  # checkpoint seq i is written before effect tool-i
            store.fork("src", seq, f"fork-{seq}")
            keys = {e.key for e in store.open(f"fork-{seq}").effects()}
            expected = {f"tool-{i}" for i in range(1, seq)}
            if keys != expected:
                wrong[seq] = (sorted(keys - expected)[:3], sorted(expected - keys)[:3])
        examples = dict(list(wrong.items())[:3])
        assert not wrong, f"{len(wrong)} of {n} forks: (extra, missing) e.g. {examples}"
    finally:
        if base != tmp_path:
            shutil.rmtree(base, ignore_errors=True)


def test_fork_of_a_run_whose_journal_gc_trimmed_is_refused(source: tuple[afk.Store, Path]) -> None:
    """The positions its checkpoints recorded no longer hold: a fork would redo dropped effects."""
    store, _ = source
    at = _seq_after_items(store.open("src"), FORK_AFTER)
    report = store.gc(RetentionPolicy(max_effects_per_run=2, keep_runtime_states=10**6))
    assert report.compacted[0].effects_dropped > 0
    assert store.read_meta("src").extra["journal_trimmed"] == report.compacted[0].effects_dropped
    with pytest.raises(afk.AfkLocalError, match="trimmed"):
        store.fork("src", at, "fork")
    assert "fork" not in store.run_ids()


@pytest.mark.parametrize("key", [None, "fork test key"])
def test_a_fork_at_the_last_seq_of_a_pack_survives_gc_and_resumes(
    tmp_path: Path, key: str | None
) -> None:
    """Found by the whole-program fuzzer (seed i38-torture, program 5461): a fork at the
    newest checkpoint a pack holds kept that pack whole and said its loose files start
    after it, so gc took the fork point's own loose copy for a stale leftover and deleted
    it (``latest`` dangling); the resumed fork then wrote its next checkpoint chained to
    nothing (keyed: an HMAC mismatch; here: the meta ahead of the files)."""
    store = afk.Store(tmp_path / "store", key=key, head_dir=tmp_path / "heads")
    with store.create("r0") as run:
        run.checkpoint("runtime_state", {"i": 1}, step=1)
        run.finish("done")
    store.pack()
    store.fork("r0", 1, "f")
    store.gc(RetentionPolicy(keep_runtime_states=0))
    assert store.open("f").latest().seq == 1
    with store.resume_writer("f") as fork:
        fork.finish("done again")
    report = store.open("f", lazy=True).verify()
    assert report.ok, report.problems
    assert [c.phase for c in store.open("f").history()] == ["runtime_state", "run_terminal"]
