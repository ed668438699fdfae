"""Every command takes --json (parsed here), and every user error is one line, exit 2.

The CLI runs in this process (``afk_local.cli.main``): these are facts about the
command line's output, not about process boundaries (test_cli.py and the script-job
and watcher tests cover those with real processes).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import cli_jobs
import pytest
from proc import SUPPORT

import afk_local as afk
from afk_local.cli import main


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """``cli(*argv)`` -> (exit code, stdout, stderr); cwd and sys.path restored after."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delenv("AFK_LOCAL_ROOT", raising=False)

    def run(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


@pytest.fixture
def store(tmp_path: Path) -> afk.Store:
    store = afk.Store(tmp_path / "store")
    job = cli_jobs.count_job.with_store(store)
    assert job.run(3, str(tmp_path / "out.txt"), run_id="done") == cli_jobs.expected_total(3)
    with pytest.raises(afk.RunPaused):
        cli_jobs.ask_job.with_store(store).run("colour?", run_id="paused")
    params = {"args": [2, str(tmp_path / "i.txt")], "kwargs": {}}
    with store.create("interrupted", entrypoint="cli_jobs:count_job", params=params) as run:
        run.checkpoint("runtime_state", {"state": {"total": 0}, "cursors": {}}, step=0)
    return store


def as_json(result: tuple[int, str, str]) -> object:
    code, out, err = result
    assert code == 0, err
    return json.loads(out)


def test_every_command_takes_json(
    cli, store: afk.Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = str(store.root)
    runs = as_json(cli("--root", r, "runs", "--json"))
    assert {x["run_id"]: x["cannot_resume"] for x in runs} == {
        "done": None,
        "paused": None,
        "interrupted": None,
    }
    assert as_json(cli("--root", r, "show", "done", "--json"))["status"] == "completed"
    phases = [c["phase"] for c in as_json(cli("--root", r, "log", "done", "--json"))]
    assert phases[0] == "runtime_state" and phases[-1] == "run_terminal"  # a new run's
    assert as_json(cli("--root", r, "inspect", "done", "--json"))["phase"] == "run_terminal"
    assert len(as_json(cli("--root", r, "effects", "done", "--json"))) == 3
    assert "changed" in as_json(cli("--root", r, "diff", "done", "2", "3", "--json"))
    assert as_json(cli("--root", r, "verify", "--json"))["ok"] is True
    assert as_json(cli("--root", r, "gc", "--dry-run", "--json"))["dry_run"] is True

    exported = tmp_path / "done.json"
    written = as_json(cli("--root", r, "export", "done", "-o", str(exported), "--json"))
    assert written == {
        "run_id": "done",
        "path": str(exported),
        "format": "json",
        "checkpoints": len(store.open("done").checkpoint_files()),
        "effects": 6,
        "bytes": exported.stat().st_size,
    }
    assert exported.stat().st_mode & 0o077 == 0  # 0600, like the run's own files
    assert as_json(cli("--root", r, "export", "done", "--json"))["meta"]["run_id"] == "done"
    imported = as_json(cli("--root", r, "import", str(exported), "--as", "copy", "--json"))
    assert imported["run_id"] == "copy" and imported["status"] == "completed"

    forked = as_json(cli("--root", r, "fork", "done", "--at", "3", "--as", "redo", "--json"))
    assert forked["run_id"] == "redo" and forked["forked_from"] == "done"
    assert forked["at_seq"] == 3 and forked["status"] == "created"
    resumed = as_json(cli("--root", r, "resume", "redo", "--json"))
    assert resumed == {"run_id": "redo", "status": "completed", "result": 5}
    assert as_json(cli("--root", r, "resume", "done", "--json")) == {
        "run_id": "done",
        "status": "completed",
        "result": 5,
    }
    paused = as_json(cli("--root", r, "resume", "paused", "--json"))
    assert paused == {
        "run_id": "paused",
        "status": "paused",
        "kind": "input",
        "prompt": {"question": "colour?"},
    }
    answered = as_json(cli("--root", r, "resume", "paused", "--input", '"blue"', "--json"))
    assert answered["result"] == {"question": "colour?", "answer": "blue"}
    requested = as_json(cli("--root", r, "resume", "interrupted", "--via-watcher", "--json"))
    assert requested["run_id"] == "interrupted" and requested["status"] == "requested"
    cli("--root", r, "fork", "done", "--at", "2", "--as", "to-cancel")
    assert as_json(cli("--root", r, "cancel", "to-cancel", "--json")) == {
        "run_id": "to-cancel",
        "status": "cancelled",
        "reason": "cancelled from the command line",
    }

    submitted = as_json(
        cli("--root", r, "submit", "cli_jobs:count_job", f'[2, "{tmp_path / "s.txt"}"]', "--json")
    )
    assert submitted["status"] == "created" and submitted["entrypoint"] == "cli_jobs:count_job"
    # right after submit the run is there: show works (no hint that fails)
    shown = as_json(cli("--root", r, "show", submitted["run_id"], "--json"))
    assert shown["status"] == "created"

    # the run made with store.create records no origin: its child needs cli_jobs on the path
    monkeypatch.setenv("PYTHONPATH", str(SUPPORT))
    code, out, err = cli("--root", r, "watch", "--once", "--json")
    assert code == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    assert sorted((e["event"], e["run_id"]) for e in events) == sorted(
        [
            ("resumed", "interrupted"),  # the --via-watcher request
            ("completed", "interrupted"),
            ("started", submitted["run_id"]),  # its first attempt, not a resume
            ("completed", submitted["run_id"]),
        ]
    )

    demo = as_json(cli("demo", "--steps", "6", "--json"))
    assert demo["exactly_once"] is True and demo["steps"] == 6 and demo["store"] is None


def test_submit_validates_the_entrypoint_before_queueing(cli, store: afk.Store) -> None:
    r = str(store.root)
    before = sorted(store.run_ids())
    code, out, err = cli("--root", r, "submit", "no_such_module_xyz:job")
    assert (code, out) == (2, "")
    assert err.startswith(
        "afk-local: run '(new run)': cannot resume entrypoint 'no_such_module_xyz:job': "
        "No module named 'no_such_module_xyz'"
    )
    assert len(err.splitlines()) == 1
    code, out, err = cli("--root", r, "submit", "cli_jobs:expected_total")
    assert (code, out) == (2, "")
    assert err.endswith("it is not an @afk.durable function\n")
    code, out, err = cli("--root", r, "submit", "not an entrypoint")
    assert err == (
        "afk-local: 'not an entrypoint' is not module:function (e.g. mypkg.jobs:crawl): name "
        "an @afk.durable job in an importable module\n"
    )
    assert sorted(store.run_ids()) == before  # nothing queued


def test_user_errors_are_one_line_and_exit_2(cli, store: afk.Store, tmp_path: Path) -> None:
    r = str(store.root)
    missing = tmp_path / "no-such-store"
    no_store = (
        f"afk-local: no store at {missing} (from --root): the directory does not exist; check "
        "the path, or give the store's directory with --root or AFK_LOCAL_ROOT\n"
    )
    cases: list[tuple[tuple[str, ...], str]] = [
        (("--root", str(missing), "runs"), no_store),
        (("--root", str(missing), "gc"), no_store),
        (("--root", str(missing), "watch", "--once"), no_store),
        (("--root", str(missing), "resume", "x"), no_store),
        (
            ("--root", r, "show", "nope"),
            f"afk-local: run 'nope' not found under {r}: run `afk-local runs --root {r}` to "
            "list the runs there\n",
        ),
        (
            ("--root", r, "resume", "paused", "--input", "{oops"),
            "afk-local: --input is not valid JSON (Expecting property name enclosed in double "
            'quotes at line 1 column 2): quote it for the shell, e.g. --input \'{"answer": '
            "42}'\n",
        ),
        (
            ("--root", r, "resume", "interrupted", "--input", "1"),
            "afk-local: run 'interrupted' is running, not paused: --input answers a paused "
            f"run's question; resume it without --input: afk-local --root {r} resume "
            "interrupted\n",
        ),
        (
            ("--root", r, "resume", "done", "--input", "1"),
            "afk-local: run 'done' is completed, not paused: --input answers a paused run's "
            f"question; it is done (`afk-local --root {r} show done` shows its result)\n",
        ),
        (
            ("--root", r, "settle", "done", "append#1", "--failed", "x", "--result", "1"),
            "afk-local: --result goes with --done (the result the call returned)\n",
        ),
        (
            ("--root", r, "export", "done", "-o", str(tmp_path / "no-dir" / "x.json")),
            f"afk-local: cannot write {tmp_path / 'no-dir' / 'x.json'}: No such file or "
            "directory\n",
        ),
        (("demo", "--steps", "1"), "afk-local: --steps must be at least 2, got 1\n"),
    ]
    before = {p: p.stat().st_mtime_ns for p in store.root.rglob("*")}
    for argv, message in cases:
        code, out, err = cli(*argv)
        assert (code, out, err) == (2, "", message), argv
    assert not missing.exists()  # a mistyped root is never created
    assert {p: p.stat().st_mtime_ns for p in store.root.rglob("*")} == before


@pytest.mark.skipif(not Path("/sys/kernel").is_dir(), reason="needs a Linux /sys")
def test_an_unwritable_root_is_one_line(cli, tmp_path: Path) -> None:
    exported = tmp_path / "x.json"
    exported.write_text('{"format": "afk-local-export"}')
    # /sys refuses new entries even to root, where chmod-based tests cannot
    code, out, err = cli("--root", "/sys/afk-store", "import", str(exported))
    assert (code, out) == (2, "")
    assert err == (
        "afk-local: cannot use /sys/afk-store: Operation not permitted; choose a writable "
        "directory with --root or AFK_LOCAL_ROOT\n"
    )


def test_show_never_suggests_a_command_that_fails(cli, store: afk.Store) -> None:
    r = str(store.root)
    with store.create("live", entrypoint="cli_jobs:count_job"):  # this process owns it
        shown = as_json(cli("--root", r, "show", "live", "--json"))
        assert "cancel" not in shown["next"]
        assert shown["next"].startswith("a process is running it (pid ")
    with store.create("loop", extra={"kind": "StateCheckpoint"}) as run:
        run.checkpoint("runtime_state", {"i": 1}, step=1)
    shown = as_json(cli("--root", r, "show", "loop", "--json"))
    assert shown["next"].startswith("cannot be resumed: it records no entrypoint")
    code, _, err = cli("--root", r, "resume", "loop")
    assert code == 2 and err.startswith("afk-local: run 'loop' cannot be resumed: it records")


def test_json_before_the_command_and_the_fields_the_docs_show(
    cli, store: afk.Store, tmp_path: Path
) -> None:
    relative = "store"  # the cli fixture runs in tmp_path: the store by a relative root
    before = as_json(cli("--json", "--root", relative, "runs"))
    assert before == as_json(cli("--root", relative, "runs", "--json"))
    assert as_json(cli("--json", "show", "done", "--root", relative))["run_id"] == "done"

    listed = {r["run_id"]: r for r in before}  # type: ignore[union-attr]
    assert listed["done"]["lock_problem"] is None  # as docs/cli.md shows it
    assert list(listed["done"])[:5] == [
        "run_id", "status", "interrupted", "owner_alive", "lock_problem"
    ]  # fmt: skip
    shown = as_json(cli("--root", relative, "show", "done", "--json"))
    assert shown["path"] == str(tmp_path / "store" / "runs" / "done")  # absolute

    code, table, _ = cli("--root", relative, "runs")
    assert code == 0
    header, *rows = table.splitlines()[:4]
    assert header.split()[:3] == ["RUN", "STATUS", "OWNER"]
    at = header.index("OWNER")
    owners = {row.split()[0]: row[at:].split()[0] for row in rows}
    assert owners == {"interrupted": "gone", "paused": "-", "done": "-"}
