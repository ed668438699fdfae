"""The durable runner: crash/resume with real SIGKILLs, iterate, pause, retries, code changes."""

from __future__ import annotations

import asyncio
import errno
import importlib
import random
import subprocess
import sys
import textwrap
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import proc
import pytest
import runner_jobs as rj
from proc import SUPPORT

import afk_local as afk
from afk_local.agent.resume import resume_run
from afk_local.runner.operations.resume import load_entrypoint
from afk_local.storage import fsio
from afk_local.testing import run_and_kill

EXPECTED_TOTAL = sum(i * i for i in range(rj.STEPS))
# Durable I/O calls of one uninterrupted 50-step attempt, roughly: kill points are drawn below this.
IO_SPAN = {"sync": 600, "async": 600, "exit": 260}


def _lines(path: Path) -> list[int]:
    if not path.exists():
        return []
    return [int(line.split()[0]) for line in path.read_text().splitlines()]


def _crash_trial(mode: str, seed: int, root: Path, max_kills: int) -> str | None:
    """One trial: kill the job at random I/O points, resume in new processes until it completes."""
    rng = random.Random(seed)
    job = rj.APPENDERS[mode]
    out = root / f"out-{seed}.txt"
    store = afk.Store(root / f"store-{seed}")
    run_id = f"trial-{seed}"
    kills = rng.randint(1, max_kills)
    for _ in range(kills):
        result = run_and_kill(
            job, str(out), at=rng.randint(1, IO_SPAN[mode]), store=store, run_id=run_id
        )
        if not result.killed:
            if result.returncode != 0:
                return f"seed {seed}: child failed: {result.stderr[-2000:]}"
            break
    else:
        if max_kills == 1:
            # Default suite: the final resume runs in this (test) process, a different
            # process from the killed one, which halves the process start-ups.
            try:
                job.with_store(store).run(str(out), run_id=run_id)
            except Exception as exc:
                return f"seed {seed}: resume failed: {exc!r}"
        else:
            result = run_and_kill(job, str(out), at=None, store=store, run_id=run_id)
            if result.returncode != 0:
                return f"seed {seed}: resume failed: {result.stderr[-2000:]}"
    reader = store.open(run_id)
    state = reader.resume_state()
    if not state.terminal or state.result != EXPECTED_TOTAL:
        return f"seed {seed}: result {state.result!r}, status {reader.meta.status}"
    lines = _lines(out)
    if sorted(lines) != list(range(rj.STEPS)):
        return f"seed {seed}: side effects not exactly once: {sorted(lines)}"
    if not reader.verify().ok:
        return f"seed {seed}: verify: {reader.verify().problems}"
    return None


@pytest.mark.parametrize("mode", ["sync", "async", "exit"])
def test_kill_anywhere_then_resume_gives_same_result_and_effects_once(
    mode, tmp_path, trials, request
):
    # Default suite: 10 random kill points a run (new ones every run); --slow, as CI: 20.
    n = trials(20 if request.config.getoption("--slow") else 10, 200)
    max_kills = 3 if request.config.getoption("--torture") else 1
    base = random.randrange(1 << 30)
    with ThreadPoolExecutor(max_workers=2) as pool:
        problems = list(
            pool.map(lambda s: _crash_trial(mode, s, tmp_path, max_kills), range(base, base + n))
        )
    failures = [p for p in problems if p]
    assert not failures, failures[:3]


def test_uninterrupted_run_matches(tmp_path):
    out = tmp_path / "out.txt"
    for mode, job in rj.APPENDERS.items():
        store = afk.Store(tmp_path / mode)
        assert job.with_store(store).run(str(out) + mode, run_id="r") == EXPECTED_TOTAL
        assert sorted(_lines(Path(str(out) + mode))) == list(range(rj.STEPS))


def test_iterate_resumes_at_first_unfinished_item(tmp_path):
    store = afk.Store(tmp_path / "s")
    # Each item's checkpoint does two renames (file, latest): land inside item ~280-380's,
    # after the writer has packed its first 256 loose files (DEFAULT_LOOSE_LIMIT).
    at = random.randint(560, 760)
    killed = run_and_kill(rj.counting_loop, 400, at=at, on="rename", store=store, run_id="loop")
    assert killed.killed, killed.stderr
    printed = [int(line.split()[1]) for line in killed.stdout.splitlines()]
    durable_cursor = store.open("loop").resume_state().state["cursors"]["iterate#1"]["n"]
    assert printed[-1] in (durable_cursor - 1, durable_cursor)
    resumed = run_and_kill(rj.counting_loop, 400, at=None, store=store, run_id="loop")
    assert resumed.returncode == 0, resumed.stderr
    again = [int(line.split()[1]) for line in resumed.stdout.splitlines()]
    assert again[0] == durable_cursor
    assert again == list(range(durable_cursor, 400))
    assert store.open("loop").resume_state().result == sum(range(400))


def test_pause_resume_across_processes(tmp_path):
    root = tmp_path / "s"
    store = afk.Store(root)
    first = run_and_kill(rj.approval, 21, at=None, store=store, run_id="pay")
    assert first.paused, first.stderr
    meta = store.read_meta("pay")
    assert meta.status is afk.RunStatus.PAUSED
    assert meta.pause.prompt == {"question": "pay?", "quote": 42}
    files_before = [f.name for f in store.open("pay").checkpoint_files()]

    # Anything that gives no input leaves the run paused and writes nothing.
    again = run_and_kill(rj.approval, 21, at=None, store=store, run_id="pay")
    assert again.paused
    script = (
        "import sys, afk_local as afk\n"
        "try:\n    afk.resume('pay', store=sys.argv[1])\n"
        "except afk.RunPaused:\n    print('paused')\n"
    )
    # afk.resume of a paused run without input needs not even the job's code
    assert proc.run(script, str(root)).stdout.strip() == "paused"
    assert [f.name for f in store.open("pay").checkpoint_files()] == files_before
    assert store.read_meta("pay").status is afk.RunStatus.PAUSED

    done = proc.run(
        "import sys, afk_local as afk\nprint(afk.resume('pay', store=sys.argv[1], input='yes'))",
        str(root),
        env={"PYTHONPATH": str(SUPPORT)},
    )
    assert done.returncode == 0, done.stderr
    assert "paid 42" in done.stdout
    assert rj.approval.with_store(store).run(run_id="pay") == {
        "quote": 42,
        "answer": "yes",
        "paid": "paid 42",
    }


def test_failed_run_retries_replaying_finished_steps(tmp_path):
    store = afk.Store(tmp_path / "s")
    log_path = tmp_path / "calls.log"
    job = rj.flaky.with_store(store)
    with pytest.raises(RuntimeError, match="boom at step 7"):
        job.run(str(log_path), run_id="f")
    meta = store.read_meta("f")
    assert meta.status is afk.RunStatus.FAILED
    assert "boom at step 7" in meta.error.message and "Traceback" in meta.error.traceback
    assert log_path.read_text().split() == [f"step{i}" for i in range(1, 7)]
    result = job.run(run_id="f")
    assert result == [f"step{i}" for i in range(1, 11)]
    # steps 1-6 were replayed from the journal, not executed again
    assert log_path.read_text().split() == [f"step{i}" for i in range(1, 11)]
    assert store.read_meta("f").attempt == 2
    assert store.read_meta("f").status is afk.RunStatus.COMPLETED


def test_completed_run_returns_stored_result_without_running(tmp_path):
    store = afk.Store(tmp_path / "s")
    calls = []

    @afk.durable(store=store)
    def once(ctx, x):
        calls.append(x)
        return {"x": x}

    assert once.run(5, run_id="c") == {"x": 5}
    assert once.run(5, run_id="c") == {"x": 5}
    assert afk.resume("c", store=store) == {"x": 5}
    assert calls == [5]
    with pytest.raises(ValueError, match="other arguments"):
        once.run(6, run_id="c")


def _write_module(path: Path, body: str) -> None:
    path.write_text(textwrap.dedent(body))


def test_code_change_warns_refuses_and_migrates(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    root = tmp_path / "store"
    src = """
        import afk_local as afk

        @afk.durable(store={root!r}, version={version!r}, on_code_change={policy!r})
        def job(ctx):
            ctx.state.setdefault("items", [1, 2])
            {extra}
            ctx.pause("go?")
            ctx.pause("sure?")
            return ctx.state
    """
    mod_path = tmp_path / "changing_job.py"

    def load(version, policy="resume", extra="pass"):
        _write_module(
            mod_path, src.format(root=str(root), version=version, policy=policy, extra=extra)
        )
        sys.modules.pop("changing_job", None)
        importlib.invalidate_caches()
        return importlib.import_module("changing_job").job

    job = load("1")
    with pytest.raises(afk.RunPaused):
        job.run(run_id="cc")

    # refuse: the source changed, nothing runs, the run stays paused
    load("1", policy="refuse", extra="ctx.state['changed'] = True")
    with pytest.raises(afk.CodeChangedError, match="refuse"):
        afk.resume("cc", store=root, input=True)
    assert afk.Store(root).read_meta("cc").status is afk.RunStatus.PAUSED

    # resume (default): warns, continues to the next pause
    load("1", extra="ctx.state['changed'] = True")
    with pytest.warns(afk.CodeChangedWarning, match="changed code"), pytest.raises(afk.RunPaused):
        afk.resume("cc", store=root, input=True)

    # a migration upgrades the old state when the run resumes under a newer version
    @afk.migration("1", "2")
    def add_total(state):
        return {**state, "total": sum(state["items"])}

    load("2", extra="ctx.state['changed'] = True")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", afk.CodeChangedWarning)
        result = afk.resume("cc", store=root, input=True)
    assert result == {"items": [1, 2], "changed": True, "total": 3}


def test_params_must_be_msgpackable(tmp_path):
    @afk.durable(store=tmp_path)
    def job(ctx, thing):
        return 1

    with pytest.raises(TypeError, match=r"cannot store args\.0: object is neither msgpack data"):
        job.run(object())


def test_main_entrypoint_explains(tmp_path):
    with pytest.raises(afk.errors.EntrypointError, match="__main__"):
        load_entrypoint("__main__:job", "r1")
    with pytest.raises(afk.errors.EntrypointError, match="PYTHONPATH"):
        load_entrypoint("no_such_module_xyz:job", "r1")
    assert load_entrypoint(rj.flaky.entrypoint) is rj.flaky


def test_cancel_makes_run_terminal(tmp_path):
    store = afk.Store(tmp_path)
    with pytest.raises(afk.RunPaused):
        rj.approval.with_store(store).run(3, run_id="x")
    afk.cancel("x", store=store, reason="not needed")
    assert store.read_meta("x").status is afk.RunStatus.CANCELLED
    with pytest.raises(afk.RunCancelledError, match="not needed"):
        afk.resume("x", store=store, input="yes")


def test_step_keys_are_stable_and_scoped(afk_store):
    @afk.durable
    def job(ctx):
        ctx.step("a", lambda: 1)
        ctx.step("a", lambda: 2)
        for item in ctx.iterate(["p", "q"], key=str, progress=False):
            ctx.step("a", lambda i: i, item)
        return ctx.idempotency_key("x") == ctx.idempotency_key("x")

    assert job.run(run_id="k")
    keys = [e.key for e in afk_store.open("k").effects() if e.kind == "outcome"]
    assert keys == ["a#1", "a#2", "iterate#1[p]/a#1", "iterate#1[q]/a#1"]


def test_async_job_with_astep_and_aiterate(afk_store):
    calls = []

    async def fetch(x):
        await asyncio.sleep(0)
        calls.append(x)
        return x * 10

    @afk.durable
    async def job(ctx, items):
        ctx.state.setdefault("acc", [])
        async for item in ctx.aiterate(items, progress=False):
            ctx.state["acc"].append(await ctx.astep("fetch", fetch, item))
        return ctx.state["acc"]

    assert job.run([1, 2, 3], run_id="a") == [10, 20, 30]
    assert job.run([1, 2, 3], run_id="a") == [10, 20, 30]
    assert calls == [1, 2, 3]


def test_resume_run_is_resume(afk_store):
    with pytest.raises(afk.RunPaused):
        rj.approval.run(1, run_id="r")
    assert resume_run("r", afk_store, "no") == {"quote": 2, "answer": "no", "paid": None}


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_fsync_failure_stops_the_job_and_the_run_resumes_from_disk(tmp_path, mode):
    store = afk.Store(tmp_path / "s")
    job = rj.APPENDERS[mode].with_store(store)
    out = tmp_path / "out.txt"
    count = {"n": 0}

    def hook(operation, path):
        # The first runtime_state checkpoint's fsync: every mode writes at least one
        # (async may coalesce the others away under load, exit writes it at the end),
        # so the failure always lands, wherever the mode puts that write.
        if operation == "fsync" and ".runtime_state.ckpt" in path:
            count["n"] += 1
            if count["n"] == 1:
                raise OSError(errno.EIO, "injected", path)

    previous = fsio.set_io_hook(hook)
    try:
        with pytest.raises((OSError, afk.WriterFailedError)):
            job.run(str(out), run_id="io")
    finally:
        fsio.set_io_hook(previous)
    # not marked failed: the run is interrupted and resumes from what is on disk
    assert store.read_meta("io").status is afk.RunStatus.RUNNING
    assert job.run(run_id="io") == EXPECTED_TOTAL
    assert sorted(_lines(out)) == list(range(rj.STEPS))


FORKING = """
import os, sys, runner_jobs
job = getattr(runner_jobs, "forking_" + sys.argv[2]).with_store(sys.argv[1])
print(job.run(sys.argv[1], run_id="r"), flush=True)
"""


@pytest.mark.parametrize("mode", ["sync", "async", "exit"])
def test_os_fork_in_a_step_leaves_the_run_to_the_parent(tmp_path, mode):
    """The forked child exits through the job's stack and atexit: it writes nothing, hangs not."""
    root = tmp_path / "s"
    child = proc.spawn(FORKING, str(root), mode, env={"PYTHONPATH": str(SUPPORT)})
    try:  # the helper holds the same stdout: this returns once it exited too
        out, err = child.communicate(timeout=40)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        pytest.fail("the forked helper hung at exit (waiting for a queue no thread writes)")
    assert child.returncode == 0 and out.split() == ["6"], err
    reader = afk.Store(root).open("r")
    assert reader.meta.status is afk.RunStatus.COMPLETED
    history = reader.history()
    assert history[-1].phase == "run_terminal"
    assert reader.latest() == history[-1], [(c.seq, c.phase) for c in history]
    assert reader.verify().ok, reader.verify().problems


def test_an_unstorable_result_or_argument_is_named_as_what_it_is(tmp_path):
    class Thing:
        pass

    @afk.durable(store=tmp_path)
    def returns_a_thing(ctx):
        return ctx.step("make", Thing)

    @afk.durable(store=tmp_path)
    def passes_a_thing(ctx):
        return ctx.step("use", repr, Thing())

    with pytest.raises(TypeError, match="ran, but its result cannot be journaled") as result:
        returns_a_thing.run(run_id="result")
    assert "cannot store the result: " in str(result.value)
    assert "(an argument)" not in str(result.value)
    with pytest.raises(afk.UnstorableValueError, match=r"cannot store \(an argument\): "):
        passes_a_thing.run(run_id="argument")

    # resumed, the result's effect is in doubt: nothing claims a crash made it so
    with pytest.raises(afk.EffectInDoubtError) as doubt:
        afk.resume("result", store=tmp_path)
    message = str(doubt.value)
    assert "crash" not in message
    assert "the result it returned could not be stored" in message


def test_a_step_returning_a_tuple_keyed_dict_is_journaled_and_replayed(tmp_path):
    """It failed only after its effect ran, leaving the effect in doubt."""
    calls: list[int] = []

    def grid() -> dict[tuple[int, int], str]:
        calls.append(1)
        return {(0, 1): "a", (1, 0): "b"}

    @afk.durable(store=afk.Store(tmp_path))
    def job(ctx: afk.RunContext) -> dict[tuple[int, int], str]:
        result: dict[tuple[int, int], str] = ctx.step("grid", grid)
        ctx.state["n"] = 2**70 if ctx.attempt == 1 else 0  # the first attempt fails after
        ctx.checkpoint()
        return result

    with pytest.raises(afk.UnstorableValueError, match=r"state\.n: int 1180591620717411303424"):
        job.run(run_id="grid")
    assert job.run(run_id="grid") == {(0, 1): "a", (1, 0): "b"}
    assert calls == [1]  # journaled once, replayed on the second attempt
