"""What a run costs on disk (issue 29): the fsyncs of a new run, counted through the I/O
seam, each named by the guarantee it buys (docs/guarantees.md, "What a new run costs"),
and the creation that buys them: a run id is absent or whole after a crash at any call,
and nobody takes a new run's lock before its creator.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

import afk_local as afk
from afk_local.cli.main import main as cli_main
from afk_local.errors import RunExistsError
from afk_local.storage import fsio
from afk_local.storage.fsio import IoCall


@pytest.fixture
def torture(request: pytest.FixtureRequest) -> bool:
    """True under ``--torture``."""
    return bool(request.config.getoption("--torture"))


def _fsyncs(calls: list[IoCall], root: Path) -> list[str]:
    """Each fsync as ``what/it/covers`` relative to the store, temp names shortened."""
    out = []
    for call in calls:
        if call.operation != "fsync":
            continue
        rel = os.path.relpath(call.path, root)
        parts = [
            "<tmp>" if p.startswith(fsio.TEMP_PREFIX) else ("<run>" if p.startswith("r-") else p)
            for p in rel.split(os.sep)
        ]
        out.append("/".join(parts))
    return out


def _recording_store(root: Path) -> tuple[afk.Store, list[IoCall]]:
    calls: list[IoCall] = []
    store = afk.Store(root, options=afk.StoreOptions(env=fsio.Env(recorder=calls.append)))
    return store, calls


def test_a_new_one_step_sync_run_costs_seven_fsyncs_each_buying_a_guarantee(
    tmp_path: Path,
) -> None:
    store, calls = _recording_store(tmp_path)

    @afk.durable(store=store, durability="sync")
    def job(ctx: afk.RunContext, x: int) -> int:
        return ctx.step("add", lambda: x + 1)

    assert job.run(1, run_id="r-warm") == 2  # the store's own directories exist from here on
    calls.clear()
    assert job.run(2, run_id="r-1") == 3
    assert _fsyncs(calls, tmp_path) == [
        "runs/<tmp>/run.meta",  # the run's meta, already running
        "runs/<tmp>",  # its name and an empty effects.log's
        "runs",  # the run findable: one rename of the whole directory
        "runs/<run>/effects.log",  # the intent, before the effect
        "runs/<run>/effects.log",  # the outcome, before the result is used
        "runs/<run>/<tmp>",  # the terminal checkpoint's bytes (a copy of run.meta in it)
        "runs/<run>",  # its name and latest
    ]  # run.meta completed: written, never fsynced (the terminal checkpoint holds its copy)
    assert afk.Store(tmp_path).read_meta("r-1").status is afk.RunStatus.COMPLETED
    assert [c.phase for c in afk.Store(tmp_path).open("r-1").history()] == ["run_terminal"]


def test_store_create_costs_three_fsyncs_and_the_run_appears_whole(tmp_path: Path) -> None:
    store, calls = _recording_store(tmp_path)
    store.create("r-warm").close()
    calls.clear()
    with store.create("r-1") as run:
        assert store.owner_alive("r-1")
        assert sorted(os.listdir(run.paths.dir)) == ["owner.lock", "run.meta"]
    assert _fsyncs(calls, tmp_path) == ["runs/<tmp>/run.meta", "runs/<tmp>", "runs"]
    assert sorted(os.listdir(tmp_path / "runs")) == ["r-1", "r-warm"]  # no temporary left


def test_a_deferred_new_run_is_invisible_until_its_first_checkpoint(tmp_path: Path) -> None:
    store = afk.Store(tmp_path)
    run = store.create("r-1", publish_with_first_write=True)
    try:
        run.update_meta(status=afk.RunStatus.RUNNING)  # waits for the publish
        assert not store.exists("r-1")
        assert store.runs() == []
        run.checkpoint("runtime_state", {"n": 1}, step=1)
        assert store.exists("r-1")
        assert store.owner_alive("r-1")
        assert store.read_meta("r-1").status is afk.RunStatus.RUNNING
    finally:
        run.close()
    unused = store.create("r-2", publish_with_first_write=True)
    unused.close()  # published by close, as create() would have: the run exists, created
    assert store.read_meta("r-2").status is afk.RunStatus.CREATED
    assert sorted(os.listdir(tmp_path / "runs")) == ["r-1", "r-2"]


def test_a_lost_race_for_a_deferred_run_id_raises_run_exists_from_the_publish(
    tmp_path: Path,
) -> None:
    store = afk.Store(tmp_path)
    loser = store.create("r-1", publish_with_first_write=True)
    with store.create("r-1") as winner:
        winner.checkpoint("runtime_state", {"who": "winner"}, step=1)
    try:
        with pytest.raises(RunExistsError):
            loser.checkpoint("runtime_state", {"who": "loser"}, step=1)
    finally:
        loser.close()
    assert store.open("r-1").latest().payload == {"who": "winner"}
    assert sorted(os.listdir(tmp_path / "runs")) == ["r-1"]


CREATE_THEN_RUN = """
import sys
import afk_local as afk
from afk_local.testing import kill_at_io_call
root, at = sys.argv[1], int(sys.argv[2])
switch = kill_at_io_call(at)
store = afk.Store(root)
store.create("r-made").close()
print("made", flush=True)

@afk.durable(store=store)
def job(ctx, x):
    return ctx.step("add", lambda: x + 1)

print("result", job.run(1, run_id="r-job"), flush=True)
print("calls", switch.calls, flush=True)
"""


def _child(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


def test_a_creation_killed_at_any_durable_call_leaves_no_run_or_a_whole_one(
    tmp_path: Path, torture: bool
) -> None:
    full = _child(CREATE_THEN_RUN, str(tmp_path / "count"), "0")
    assert full.returncode == 0, full.stderr
    total = int(full.stdout.split()[-1])
    assert total >= 40
    # Calls 9 to 29 create both runs (1-8 make the store itself); the default run kills at
    # every other one of them, --torture at every call of the script.
    points = range(1, total + 1) if torture else range(9, 30, 2)
    for at in points:
        root = tmp_path / f"k{at}"
        killed = _child(CREATE_THEN_RUN, str(root), str(at))
        assert killed.returncode == -9, (at, killed.stderr)
        store = afk.Store(root)
        assert {r.run_id for r in store.runs()} <= {"r-made", "r-job"}, at
        if "made" in killed.stdout:
            assert store.read_meta("r-made").status is afk.RunStatus.CREATED, at
        for run_id in ("r-made", "r-job"):
            if store.exists(run_id):  # whole: it opens for writing
                with store.resume_writer(run_id) as run:
                    run.checkpoint("runtime_state", {"after": at}, step=1)
                assert store.open(run_id).verify().ok, at
            else:  # absent: the id can be created
                store.create(run_id).close()


GC_LOOP = """
import sys, time
import afk_local as afk
store = afk.Store(sys.argv[1])
deadline = time.monotonic() + float(sys.argv[2])
print("ready", flush=True)
while time.monotonic() < deadline:
    store.gc()
"""


def test_a_concurrent_gc_never_takes_a_new_runs_lock_from_its_creator(tmp_path: Path) -> None:
    store = afk.Store(tmp_path)
    store.create("r-0").close()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    gc = subprocess.Popen(
        [sys.executable, "-c", GC_LOOP, str(tmp_path), "300"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert gc.stdout is not None and gc.stdout.readline().strip() == "ready"
        for n in range(1, 301):
            store.create(f"r-{n}").close()  # a RunLockedError here fails the test
        assert gc.poll() is None  # gc ran all along
    finally:
        gc.kill()
        gc.wait()


def test_a_completed_run_whose_meta_rename_was_lost_stays_completed(tmp_path: Path) -> None:
    """The state a power cut leaves when it loses run.meta's last rename (finish() leaves it
    to the next directory fsync): the terminal checkpoint decides, nothing runs again."""
    store = afk.Store(tmp_path)
    calls: list[int] = []

    @afk.durable(store=store, durability="sync")
    def job(ctx: afk.RunContext, x: int) -> int:
        def add() -> int:
            calls.append(x)
            return x + 1

        meta = ctx.writer.run.paths.meta
        before.append(meta.read_bytes())  # run.meta as the running attempt wrote it
        return ctx.step("add", add)

    before: list[bytes] = []
    assert job.run(1, run_id="r-1") == 2
    paths = store.paths("r-1")
    paths.meta.write_bytes(before[0])  # the rename lost: the running meta is back
    assert store.read_meta("r-1").status is afk.RunStatus.COMPLETED
    assert store.interrupted() == []
    assert job.run(1, run_id="r-1") == 2  # the stored result, not a second attempt
    assert calls == [1]
    with store.resume_writer("r-1", new_attempt=False):
        pass  # a writer makes the reconciled status durable in run.meta itself
    fresh = afk.Store(tmp_path)
    assert fresh.read_meta("r-1").status is afk.RunStatus.COMPLETED
    assert fresh.open("r-1").verify().ok


@pytest.mark.parametrize("left", ["empty", "cut"])
def test_a_completed_run_whose_meta_a_power_cut_tore_keeps_its_identity(
    tmp_path: Path, left: str
) -> None:
    """run.meta completed is written without an fsync: a power cut may leave its new name
    with its bytes lost (the crash explorer's create workload reaches this state). The
    terminal checkpoint's copy stands in: same run, same status, nothing runs again."""
    store = afk.Store(tmp_path)
    calls: list[int] = []

    @afk.durable(store=store, durability="sync")
    def job(ctx: afk.RunContext, x: int) -> int:
        def add() -> int:
            calls.append(x)
            return x + 1

        return ctx.step("add", add)

    assert job.run(1, run_id="r-1", tags={"team": "a"}) == 2
    whole = store.read_meta("r-1")
    meta = store.paths("r-1").meta
    meta.write_bytes(b"" if left == "empty" else meta.read_bytes()[:40])
    fresh = afk.Store(tmp_path)
    assert fresh.read_meta("r-1") == whole  # entrypoint, params, tags, status: all of it
    report = fresh.open("r-1").verify()
    assert report.ok, report.problems
    assert any(n.startswith("run.meta: torn") for n in report.notes), report.notes
    assert job.run(1, run_id="r-1") == 2  # the stored result
    assert calls == [1]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):  # `afk-local verify` writes it back, durably
        assert cli_main(["--root", str(tmp_path), "verify", "r-1", "--json"]) == 0
    (verified,) = json.loads(out.getvalue())["runs"]
    assert [
        r.endswith("rewritten from its copy in the terminal checkpoint")
        for r in verified["repaired"]
    ] == [True], verified
    assert not any(n.startswith("run.meta") for n in fresh.open("r-1").verify().notes)
    assert afk.Store(tmp_path).read_meta("r-1") == msgspec.structs.replace(
        whole, updated_ms=afk.Store(tmp_path).read_meta("r-1").updated_ms
    )


def test_a_torn_meta_without_a_terminal_copy_is_still_reported_damaged(tmp_path: Path) -> None:
    store = afk.Store(tmp_path)
    with store.create("r-1") as run:
        run.checkpoint("runtime_state", {"n": 1}, step=1)
    store.paths("r-1").meta.write_bytes(b"")
    with pytest.raises(afk.errors.CheckpointCorruptionError):
        afk.Store(tmp_path).read_meta("r-1")
    assert not afk.Store(tmp_path).open("r-1", lazy=True).verify().ok


DIES_IN_ITS_BODY = """
import os, signal
from pathlib import Path
import afk_local as afk

@afk.durable
def job(ctx, x):
    marker = Path(os.environ["AFK_LOCAL_ROOT"]) / "died-once"
    if not marker.exists():  # the first attempt dies in its body, before any step
        marker.touch()
        print("running", ctx.store.read_meta(ctx.run_id).status, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    return x + 1
"""


def test_a_new_run_is_in_the_store_before_its_body_runs_so_a_killed_one_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No run_started checkpoint, but the run is published (running) before the body:
    a process killed in the body, before any step, leaves a run to resume."""
    (tmp_path / "dies_in_body.py").write_text(DIES_IN_ITS_BODY)
    root = tmp_path / "store"
    monkeypatch.setenv("AFK_LOCAL_ROOT", str(root))
    monkeypatch.syspath_prepend(str(tmp_path))
    killed = _child("import dies_in_body; dies_in_body.job.run(1, run_id='r-1')")
    assert killed.returncode == -9, killed.stderr
    assert killed.stdout.split() == ["running", "running"]
    store = afk.Store(root)
    assert store.interrupted() == ["r-1"]
    assert store.open("r-1").history() == []  # nothing but its meta: it had no checkpoint
    assert afk.resume("r-1", store=store) == 2
    assert [c.phase for c in store.open("r-1").history()] == ["run_started", "run_terminal"]
