"""What a durable run says about itself: a step count across attempts, n/N, metrics, tags."""

from __future__ import annotations

import os

import proc
import pytest
import report_jobs
from proc import SUPPORT

import afk_local as afk
from afk_local.storage.ops.retention import RetentionPolicy
from afk_local.storage.rundir.read.metrics import ARCHIVE_NAME
from afk_local.storage.views.run_progress import progress_of

N = 12

KILLED = """
import sys
import report_jobs
import afk_local as afk
report_jobs.metered.with_store(afk.Store(sys.argv[1])).run(int(sys.argv[2]), run_id="k")
"""


def test_step_count_continues_across_a_sigkill_and_resume(tmp_path) -> None:
    root = tmp_path / "store"
    env = {"PYTHONPATH": str(SUPPORT), "REPORT_JOBS_ACK": "1"}
    killed = proc.kill_after(proc.spawn(KILLED, str(root), str(N), env=env), acks=5)
    assert killed.returncode == -9, killed.stderr
    store = afk.Store(root)
    before = store.open("k").latest()
    assert before is not None and before.step >= len(killed.lines) - 1  # done before the crash

    assert report_jobs.metered.with_store(store).run(run_id="k") == sum(i * i for i in range(N))

    history = store.open("k").history()
    resumed_at = max(c.seq for c in history if c.phase == "run_started")
    after = [c for c in history if c.seq > resumed_at]
    assert after[0].step >= before.step  # continues, never back to 1
    assert [c.step for c in after] == sorted(c.step for c in after)
    assert history[-1].phase == "run_terminal" and history[-1].step == N  # each step once
    progress = progress_of(history[-1].payload)
    assert progress is not None and (progress.done, progress.total) == (N, N)
    info = store.info("k")
    assert info.attempt == 2 and info.step == N and info.progress == progress
    # the metrics of both attempts: one point per item, none twice
    loss = store.open("k").metrics().series("loss")
    assert [p.value for p in loss] == [1.0 / (i + 1) for i in range(N)]
    # each at its item's index, in both attempts: a chart of them is not flat
    assert [p.step for p in loss] == list(range(N))


def test_metrics_survive_a_failure_resume_and_gc(afk_store) -> None:
    job = report_jobs.metered.with_store(afk_store)
    report_jobs.FAIL_AT[:] = [4]
    with pytest.raises(ValueError, match="item 4 broke"):
        job.run(N, run_id="m")
    assert job.run(run_id="m") == sum(i * i for i in range(N))
    reader = afk_store.open("m")
    items = [p.value for p in reader.metrics().series("item")]
    assert items == [float(i) for i in range(N)]
    steps = [p.step for p in reader.metrics().series("item")]
    assert steps == list(range(N))  # the item's index, also for the item that failed once

    report = afk_store.gc(RetentionPolicy(keep_runtime_states=1))
    assert report.errors == [] and report.compacted[0].deleted_files >= N - 1
    assert (reader.paths.dir / ARCHIVE_NAME).is_file()
    after = afk_store.open("m").metrics()
    assert [p.value for p in after.series("item")] == items
    assert after.to_records() == reader.metrics().to_records()
    # a second gc archives nothing twice
    afk_store.gc(RetentionPolicy(keep_runtime_states=1))
    assert afk_store.open("m").metrics().to_records() == after.to_records()
    assert afk_store.open("m").verify().ok


@pytest.mark.parametrize("durability", ["async", "exit"])
def test_coalesced_checkpoints_hand_their_metrics_on(afk_store, durability: str) -> None:
    @afk.durable(store=afk_store, durability=durability)
    def fast(ctx: afk.RunContext, n: int) -> int:
        for i in ctx.iterate(range(n), progress=False):
            ctx.metric("i", i)
        return n

    assert fast.run(200, run_id=f"c-{durability}") == 200
    reader = afk_store.open(f"c-{durability}")
    assert [p.value for p in reader.metrics()] == [float(i) for i in range(200)]
    if durability == "exit":  # kept in memory: coalesced into one checkpoint before the end
        assert len([c for c in reader.history() if c.phase == "runtime_state"]) == 1


def test_declared_progress_counts_steps_and_tags_go_to_the_meta(afk_store) -> None:
    job = report_jobs.declared.with_store(afk_store)
    assert job.run(5, run_id="d", tags={"model": "small"}) == sum(i * i for i in range(5))
    info = afk_store.info("d")
    assert info.tags == {"model": "small", "phase": "finished"}
    assert info.progress is not None
    assert (info.progress.done, info.progress.total, info.progress.unit) == (5, 5, "steps")
    with pytest.raises(TypeError):
        job.run(5, run_id="e", tags={"n": 1})  # type: ignore[dict-item]
    assert not afk_store.exists("e")


def test_a_failure_records_the_step_that_raised(afk_store) -> None:
    report_jobs.FAIL_AT[:] = [2]
    with pytest.raises(ValueError):
        report_jobs.metered.with_store(afk_store).run(5, run_id="f")
    terminal = afk_store.open("f").latest()
    assert terminal is not None and terminal.payload["state"] == "failed"
    assert terminal.payload["failed_step"] == "iterate#1[2]/flaky#1"
    assert terminal.step == 3  # squares of items 0 and 1, then the flaky step
    assert progress_of(terminal.payload).done == 2  # type: ignore[union-attr]


def test_metric_refuses_what_is_not_a_number(afk_store) -> None:
    @afk.durable(store=afk_store)
    def bad(ctx: afk.RunContext) -> None:
        ctx.metric("x", "high")  # type: ignore[arg-type]

    with pytest.raises(ValueError):
        bad.run(run_id="b")
    assert os.path.isdir(afk_store.paths("b").dir)


def test_a_metric_is_at_its_items_index_inside_iterate_else_at_the_step_count(afk_store) -> None:
    @afk.durable(store=afk_store)
    def nested(ctx: afk.RunContext) -> None:
        ctx.step("warm-up", lambda: None)
        ctx.metric("before", 1.0)  # outside loops: the step count (1)
        for outer in ctx.iterate(["a", "b", "c"], progress=False, name="outer"):
            ctx.step("outer-step", lambda: None)
            ctx.step("outer-step-2", lambda: None)
            ctx.metric("outer", 1.0)
            for _ in ctx.iterate(range(2), progress=False, name=f"inner-{outer}"):
                ctx.metric("inner", 1.0)
            ctx.metric("outer-after", 1.0)  # back to the outer item's index
        ctx.metric("after", 1.0, step=99)  # given: kept
        ctx.metric("end", 1.0)  # outside again: the step count (1 + 3 * 2 = 7)

    nested.run(run_id="n")

    metrics = afk_store.open("n").metrics()
    steps = {name: [p.step for p in metrics.series(name)] for name in metrics.names()}
    assert steps == {
        "before": [1],
        "outer": [0, 1, 2],
        "inner": [0, 1, 0, 1, 0, 1],
        "outer-after": [0, 1, 2],
        "after": [99],
        "end": [7],
    }
