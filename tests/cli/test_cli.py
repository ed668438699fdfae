"""``afk-local``'s human and --json output.

Most commands run in this process (``cli_inproc.run_cli``: the point is their output and
exit code); each test keeps real ``python -m afk_local`` subprocesses where a process
matters: the environment's store, resuming a job (which imports it afresh), one call of
each command.

One module-scoped store holds a completed, a failed, a paused, a running (lock held by
a live child), an interrupted (SIGKILLed) run and one with an effect in doubt. Read
commands run first and must change nothing; write commands run last.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import cli_jobs
import proc
import pytest
from cli_inproc import run_cli
from proc import SUPPORT

import afk_local as afk

TESTS = str(SUPPORT)
N = 6
RUNS = ("done", "doubt", "failed", "interrupted", "live", "paused")


def cli(
    root: Path | str | None,
    *args: str,
    code: int = 0,
    env: dict[str, str] | None = None,
    real: bool = False,
):
    """Run ``afk-local [--root ROOT] args...`` (``real``: as ``python -m afk_local``); assert
    the exit code."""
    head = ["--root", str(root)] if root is not None else []
    if real:
        full_env = {k: v for k, v in os.environ.items() if k != "AFK_LOCAL_ROOT"}
        full_env["PYTHONPATH"] = TESTS + os.pathsep + full_env.get("PYTHONPATH", "")
        full_env.update(env or {})
        result = proc.python(["-m", "afk_local", *head, *args], env=full_env, timeout=120)
    else:
        result = run_cli([*head, *args], env=env)
    assert result.returncode == code, (args, result.returncode, result.stdout, result.stderr)
    if code == 2 and "usage:" not in result.stderr:
        # a user error is one clear line, never a traceback
        assert "Traceback" not in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    return result


def cli_json(root: Path, *args: str, code: int = 0, real: bool = False):
    return json.loads(cli(root, *args, "--json", code=code, real=real).stdout)


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under root with its size and mtime: 'nothing changed on disk'."""
    out = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        out[str(path.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


LIVE = """
import sys, time
import afk_local as afk
with afk.Store(sys.argv[1]).create("live", entrypoint="cli_jobs:count_job") as run:
    run.checkpoint("runtime_state", {"state": {"total": 0}, "cursors": {}}, step=0)
    print("ready", flush=True)
    time.sleep(3600)  # killed when the module's tests end, however long a loaded machine takes
"""

CRASH = """
import sys
import cli_jobs
import afk_local as afk
cli_jobs.count_job.with_store(afk.Store(sys.argv[1])).run(
    int(sys.argv[2]), sys.argv[3], run_id="interrupted")
"""


@pytest.fixture(scope="module")
def store_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    base = tmp_path_factory.mktemp("cli")
    root = base / "store"
    store = afk.Store(root)
    outside = str(base / "outside.txt")
    job = cli_jobs.count_job.with_store(store)
    assert job.run(N, outside, run_id="done") == cli_jobs.expected_total(N)
    cli_jobs.FAIL_AT[:] = [3]
    with pytest.raises(RuntimeError):
        job.run(N, outside, run_id="failed")
    with pytest.raises(afk.RunPaused):
        cli_jobs.ask_job.with_store(store).run("favourite number?", run_id="paused")
    with store.create("doubt", entrypoint="cli_jobs:count_job") as run:
        run.checkpoint("runtime_state", {"state": {"total": 0}, "cursors": {}}, step=0)
        run.effects.record_intent("charge#1", name="charge", input_hash="h", idempotency_key="ik")
    env = {"PYTHONPATH": TESTS + os.pathsep + os.environ.get("PYTHONPATH", ""), "CLI_JOBS_ACK": "1"}
    crashed = proc.kill_after(
        proc.spawn(CRASH, str(root), str(N), str(base / "crash.txt"), env=env), acks=3
    )
    assert crashed.returncode == -9, crashed.stderr
    live = proc.spawn(LIVE, str(root))
    assert live.stdout is not None and live.stdout.readline().strip() == "ready"
    try:
        yield root
    finally:
        live.kill()
        live.wait()


def test_read_commands_human_and_json(store_root: Path) -> None:
    root = store_root
    before = snapshot(root)

    table = cli(root, "runs", real=True).stdout
    for run_id in RUNS:
        assert run_id in table
    assert "running (interrupted)" in table and "running (live)" in table
    assert table.splitlines()[0].split()[:4] == ["RUN", "STATUS", "OWNER", "STEP"]
    at = table.splitlines()[0].index("OWNER")
    rows = [line for line in table.splitlines()[1:] if line.split()[0] in RUNS]
    owner = {line.split()[0]: line[at:].split()[0] for line in rows}
    assert (owner["live"], owner["interrupted"], owner["done"]) == ("alive", "gone", "-")
    runs = {r["run_id"]: r for r in cli_json(root, "runs")}
    assert set(runs) == set(RUNS)
    assert runs["done"]["status"] == "completed" and runs["failed"]["status"] == "failed"
    assert runs["paused"]["status"] == "paused"
    assert runs["interrupted"]["interrupted"] and not runs["interrupted"]["owner_alive"]
    assert runs["live"]["owner_alive"] and not runs["live"]["interrupted"]
    assert [r["run_id"] for r in cli_json(root, "runs", "--status", "paused")] == ["paused"]
    assert len(cli_json(root, "runs", "--limit", "2")) == 2
    # the store from the environment, and --root after the command
    env_runs = cli(None, "runs", "--json", env={"AFK_LOCAL_ROOT": str(root)}, real=True).stdout
    assert {r["run_id"] for r in json.loads(env_runs)} == set(RUNS)

    shown = cli(root, "show", "interrupted", real=True).stdout
    assert "interrupted" in shown and f"afk-local --root {root} resume interrupted" in shown
    assert cli_json(root, "show", "live")["owner_alive"] is True
    failed = cli_json(root, "show", "failed")
    assert "planned failure" in failed["error"]["message"]
    assert cli_json(root, "show", "paused")["pause"]["prompt"] == {"question": "favourite number?"}

    log = cli(root, "log", "done", real=True).stdout.splitlines()
    assert log[0].split() == ["SEQ", "STEP", "PROGRESS", "PHASE", "TIME", "SIZE", "FRAME"]
    assert "keyframe" in log[1] and "run_terminal" in log[-1]
    rows = cli_json(root, "log", "done")
    assert [r["seq"] for r in rows] == list(range(1, len(rows) + 1))
    assert any(r["frame"].startswith("delta<-") for r in rows)
    assert all(r["error"] is None for r in rows)

    latest = cli(root, "inspect", "done", real=True).stdout
    assert "run_terminal" in latest.splitlines()[0]
    assert json.loads(latest.split("\n", 1)[1])["terminal_result"] == cli_jobs.expected_total(N)
    state_seq = next(r["seq"] for r in rows if r["phase"] == "runtime_state" and r["step"] == 3)
    value = cli_json(root, "inspect", "done", str(state_seq), "--path", "state.total")
    assert value["value"] == cli_jobs.expected_total(3) and value["seq"] == state_seq

    effects = cli(root, "effects", "doubt", real=True).stdout
    assert "IN DOUBT" in effects and "charge#1" in effects
    done_effects = cli_json(root, "effects", "done")
    assert len(done_effects) == N and {e["state"] for e in done_effects} == {"ok"}
    assert cli_json(root, "effects", "doubt")[0]["idempotency_key"] == "ik"

    a, b = rows[1]["seq"], state_seq
    diff = cli(root, "diff", "done", str(a), str(b), real=True).stdout
    assert "~ state.total:" in diff
    changes = cli_json(root, "diff", "done", str(a), str(b))
    assert changes["changed"]["state.total"][1] == cli_jobs.expected_total(3)

    verified = cli(root, "verify", real=True).stdout
    assert "all 6 run(s) ok" in verified
    assert cli_json(root, "verify")["ok"] is True

    lines = cli(root, "export", "done", "--format", "jsonl", real=True).stdout.splitlines()
    types = [json.loads(line)["type"] for line in lines]
    assert types[:2] == ["format", "meta"] and types.count("effect") == 2 * N

    gc = cli_json(root, "gc", "--dry-run")
    assert gc["dry_run"] is True and gc["skipped_locked"] == ["live"]
    assert sum(c["deleted_files"] for c in gc["compacted"]) > 0
    assert "dry run:" in cli(root, "gc", "--dry-run", real=True).stdout

    assert snapshot(root) == before  # reading changed nothing


def test_bad_input_is_one_clear_line_and_changes_nothing(store_root: Path, tmp_path: Path) -> None:
    root = store_root
    before = snapshot(root)
    assert "not found" in cli(root, "show", "nope", code=2, real=True).stderr
    assert "invalid run id" in cli(root, "log", "../etc", code=2).stderr
    assert "has no checkpoint 999" in cli(root, "inspect", "done", "999", code=2).stderr
    assert "whole number" in cli(root, "inspect", "done", "abc", code=2).stderr
    assert "no 'nope' in payload" in cli(root, "inspect", "done", "--path", "nope", code=2).stderr
    assert "has no checkpoint 999" in cli(root, "fork", "done", "--at", "999", code=2).stderr
    assert "has no checkpoint" in cli(root, "diff", "done", "1", "999", code=2).stderr
    bad = cli(root, "resume", "paused", "--input", "{not json", code=2).stderr
    assert "--input is not valid JSON" in bad
    locked = cli(root, "cancel", "live", code=2).stderr
    assert "is being written" in locked
    assert "already completed" in cli(root, "cancel", "done", code=2).stderr
    assert snapshot(root) == before

    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    export = tmp_path / "done.json"
    cli(root, "export", "done", "-o", str(export))
    unwritable = blocker / "store"
    err = cli(unwritable, "import", str(export), code=2).stderr
    assert err == (
        f"afk-local: cannot use {unwritable}: a file is in the way ({blocker} is not a "
        "directory); choose a store directory with --root or AFK_LOCAL_ROOT\n"
    )
    err = cli(root, "import", str(blocker), code=2).stderr
    assert "is not an afk-local export" in err
    assert "a file is in the way" in cli(unwritable, "runs", code=2).stderr
    absent = cli(tmp_path / "absent", "runs", code=2).stderr  # a mistyped root is no store
    assert absent.startswith(f"afk-local: no store at {tmp_path / 'absent'} (from --root)")
    assert not (tmp_path / "absent").exists()
    (tmp_path / "empty").mkdir()
    assert "no runs under" in cli(tmp_path / "empty", "runs").stdout  # an empty store is fine
    assert snapshot(root) == before
    assert blocker.read_text() == "not a directory"


def test_write_commands(store_root: Path, tmp_path: Path) -> None:
    root = store_root
    store = afk.Store(root)

    # export / import round trip into another store
    export = tmp_path / "done.json"
    cli(root, "export", "done", "-o", str(export))
    other = tmp_path / "other"
    info = cli_json(other, "import", str(export), "--as", "copy", real=True)
    assert info["run_id"] == "copy" and info["status"] == "completed"
    copy = afk.Store(other).open("copy")
    assert copy.resume_state().result == cli_jobs.expected_total(N)
    assert copy.verify().ok and len(copy.effects()) == 2 * N

    # fork, then resume the fork through the CLI
    forked = cli_json(root, "fork", "done", "--at", "3", "--as", "done-fork", real=True)
    assert forked["parent_run_id"] == "done" and forked["seq"] == 3
    assert "completed" in cli(root, "resume", "done-fork", real=True).stdout

    # resume the SIGKILLed run: each item's side effect happened exactly once
    out = cli_json(root, "resume", "interrupted", real=True)
    assert out == {"run_id": "interrupted", "status": "completed",
                   "result": cli_jobs.expected_total(N)}  # fmt: skip
    items = [line.split()[0] for line in (root.parent / "crash.txt").read_text().splitlines()]
    assert sorted(items) == [str(i) for i in range(N)]

    # answer the paused run
    answered = cli_json(root, "resume", "paused", "--input", '{"n": 7}', real=True)
    assert answered["result"] == {"question": "favourite number?", "answer": {"n": 7}}
    again = cli(
        root, "resume", "paused", real=True
    ).stdout  # completed: nothing runs, its result shown
    assert again == 'run paused completed: {"question": "favourite number?", "answer": {"n": 7}}\n'

    # the failed run is retried by resume; cancel the one in doubt
    assert cli_json(root, "resume", "failed", real=True)["result"] == cli_jobs.expected_total(N)
    assert "cancelled" in cli(root, "cancel", "doubt", real=True).stdout
    assert store.read_meta("doubt").status is afk.RunStatus.CANCELLED

    # gc for real, then everything still verifies; the live run is untouched
    live_before = snapshot(store.paths("live").dir)
    report = cli_json(root, "gc", "--keep-runtime-states", "1", "--max-effects-per-run", "2")
    assert report["skipped_locked"] == ["live"] and not report["errors"]
    assert "0 whole run(s)" in cli(root, "gc", real=True).stdout
    assert snapshot(store.paths("live").dir) == live_before
    assert cli_json(root, "verify")["ok"] is True
    assert cli_json(root, "show", "done")["effects"] == 2


def test_verify_reports_damage_and_repairs_torn_journal_tails(tmp_path: Path) -> None:
    store = afk.Store(tmp_path)
    with store.create("r") as run:
        for i in range(5):
            run.effects.call(f"k{i}", lambda i=i: i)
            run.checkpoint("runtime_state", {"i": i}, step=i)
    assert "all 1 run(s) ok" in cli(tmp_path, "verify", real=True).stdout

    journal = store.paths("r").journal
    size = journal.stat().st_size
    with open(journal, "ab") as fh:
        fh.write(b"\x40\x00\x00\x00\x01\x02")  # a frame header whose body never made it
    out = cli(tmp_path, "verify", "r").stdout
    assert "repaired:" in out and "torn tail" in out
    assert journal.stat().st_size == size

    victim = store.paths("r").dir / store.open("r").checkpoint_files()[2].name
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    bad = cli(tmp_path, "verify", code=1).stdout
    assert f"DAMAGED {victim}" in bad
    report = cli_json(tmp_path, "verify", code=1)
    assert report["ok"] is False
    assert str(victim) in {p["path"] for p in report["runs"][0]["problems"]}


def test_notebook_reprs(store_root: Path) -> None:
    store = afk.Store(store_root)
    reader = store.open("done")
    html = reader._repr_html_()
    assert "<table" in html and "done" in html and "run_terminal" in html
    assert "checkpoints" in html
    assert repr(reader).startswith("RunReader(run_id='done'")
    info = store.info("done")
    assert "<td>done</td>" in info._repr_html_() and "completed" in info._repr_html_()
    assert repr(info).startswith("RunInfo(run_id='done', status=completed")
    assert "<script" not in store.open("paused")._repr_html_()  # payloads are escaped


def test_a_loop_without_journaled_steps_shows_its_items_done_not_step_0(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = afk.Store(root)
    cli_jobs.loop_job.with_store(store).run(4, -1, run_id="loop")
    with pytest.raises(RuntimeError):
        cli_jobs.loop_job.with_store(store).run(4, 2, run_id="broke")
    cli_jobs.count_job.with_store(store).run(2, str(tmp_path / "outside.txt"), run_id="steps")

    shown = cli(root, "show", "loop").stdout.splitlines()
    assert [line.split()[1:] for line in shown if line.startswith("progress")] == [["4/4", "100%"]]
    assert not [line for line in shown if line.split()[0] == "step"]
    assert cli_json(root, "show", "loop")["step"] == 0  # the data keeps its field
    failed = [
        line for line in cli(root, "show", "broke").stdout.splitlines() if "failed at" in line
    ]
    assert len(failed) == 1 and "failed at" in failed[0] and "step" not in failed[0]
    assert "RuntimeError: planned failure at item 2" in failed[0]
    stepped = cli(root, "show", "steps").stdout.splitlines()
    assert ["step", "2"] in [line.split() for line in stepped]
    assert [line.split()[1:] for line in stepped if line.startswith("progress")] == [
        ["2/2", "100%", "(2", "steps)"]
    ]

    log = [line.split() for line in cli(root, "log", "loop").stdout.splitlines()]
    assert log[0] == ["SEQ", "STEP", "PROGRESS", "PHASE", "TIME", "SIZE", "FRAME"]
    assert [row[1:4] for row in log[1:]] == [
        ["-", "1/4", "25%"],
        ["-", "2/4", "50%"],
        ["-", "3/4", "75%"],
        ["-", "4/4", "100%"],
        ["-", "4/4", "100%"],
    ]
    assert [r["progress"]["done"] for r in cli_json(root, "log", "loop")] == [1, 2, 3, 4, 4]
    steps_log = [line.split() for line in cli(root, "log", "steps").stdout.splitlines()[1:]]
    assert [row[1:3] for row in steps_log] == [["1", "1/2"], ["2", "2/2"], ["2", "2/2"]]

    runs = {line.split()[0]: line.split() for line in cli(root, "runs").stdout.splitlines()[1:]}
    assert runs["loop"][3] == "-" and runs["steps"][3] == "2"


def test_log_names_a_fifo_where_a_checkpoint_should_be(tmp_path):
    """It was silently left out of the list (``verify`` named it)."""
    store = afk.Store(tmp_path / "s")
    with store.create("r") as run:
        for i in range(2):
            run.checkpoint("runtime_state", {"i": i}, step=i + 1)
    os.mkfifo(tmp_path / "s" / "runs" / "r" / "000000000003.runtime_state.ckpt")
    done = proc.python(
        ["-m", "afk_local", "--root", str(tmp_path / "s"), "log", "r", "--json"],
        env=dict(os.environ),
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert [r["seq"] for r in rows] == [1, 2, 3]
    assert rows[-1]["error"] == "is a FIFO, not a regular file (ignored)"
