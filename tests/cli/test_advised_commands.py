"""Every command a message advises works as printed.

Each situation a person meets (an interrupted, paused, failed or not-started run, a
typo'd run id, a fork without ``--at``, a moved store, an imported run, a damaged
checkpoint, a renamed job, a run id a conversation cannot use, schedules) is driven from
the outside; the ``afk-local ...`` commands its message names are cut out of the text and
run exactly as printed (placeholders such as ``JSON`` or ``SEQ`` filled in the way the
message says), and must do what the message says they do.

The CLI runs in this process (``afk_local.cli.main``) and the situations share a few
stores, so the whole sweep stays quick. Messages covered elsewhere, the same way: effects
in doubt and ``settle`` (tests/cli/test_in_doubt.py), a salvaged journal
(tests/cli/test_salvage.py), a read-only store (tests/cli/test_read_only_store.py),
a not-started run (tests/cli/test_first_start.py).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import cli_jobs
import pytest
from advice import Cli, advised, follow

import afk_local as afk
from afk_local.cli import main


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Cli:
    """``cli(*argv)`` -> (exit code, stdout, stderr), from the project directory."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delenv("AFK_LOCAL_ROOT", raising=False)

    def run(*argv: str) -> tuple[int, str, str]:
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse's --help
            code = exc.code if isinstance(exc.code, int) else 2
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


@pytest.fixture
def store(tmp_path: Path) -> afk.Store:
    return afk.Store(tmp_path / ".afk")


def interrupted_run(store: afk.Store, run_id: str, outside: Path) -> None:
    params = {"args": [3, str(outside)], "kwargs": {}}
    with store.create(run_id, entrypoint="cli_jobs:count_job", params=params) as run:
        run.checkpoint("runtime_state", {"state": {"total": 0}, "cursors": {}}, step=0)


def test_show_and_resume_advise_commands_that_work(
    cli: Cli, store: afk.Store, tmp_path: Path
) -> None:
    root = store.root
    outside = str(tmp_path / "out.txt")
    interrupted_run(store, "cut", tmp_path / "cut.txt")
    with pytest.raises(afk.RunPaused) as paused:
        cli_jobs.ask_job.with_store(store).run("colour?", run_id="asks")
    assert advised(str(paused.value)) == ["afk-local resume asks --input JSON"]
    cli_jobs.FAIL_AT[:] = [1]
    with pytest.raises(RuntimeError, match="planned failure"):
        cli_jobs.count_job.with_store(store).run(3, outside, run_id="broke")

    # interrupted: `show` says resume
    next_step = json.loads(cli("--root", str(root), "show", "cut", "--json")[1])["next"]
    assert [code for code, _ in follow(cli, next_step, root=root)] == [0]
    assert store.read_meta("cut").status is afk.RunStatus.COMPLETED

    # another job's run id: resume that run instead (it is paused: it says so)
    with pytest.raises(ValueError, match="belongs to cli_jobs:ask_job") as taken:
        cli_jobs.count_job.with_store(store).run(3, outside, run_id="asks")
    ((code, out),) = follow(cli, str(taken.value), root=root)
    assert code == 0 and out.startswith("run asks paused waiting for")

    # paused: `resume` without an answer says how to answer, and so does `show`
    code, out, _ = cli("--root", str(root), "resume", "asks")
    assert code == 0 and out.startswith("run asks paused waiting for")
    next_step = json.loads(cli("--root", str(root), "show", "asks", "--json")[1])["next"]
    assert [c.endswith("resume asks --input JSON") for c in advised(next_step + out)] == [
        True,
        True,
    ]
    assert [code for code, _ in follow(cli, out, root=root, JSON='"blue"')] == [0]
    assert store.read_meta("asks").status is afk.RunStatus.COMPLETED

    # failed: `show` names the retry and the checkpoint list
    next_step = json.loads(cli("--root", str(root), "show", "broke", "--json")[1])["next"]
    results = follow(cli, next_step, root=root)
    assert [code for code, _ in results] == [0, 0], results
    assert store.read_meta("broke").status is afk.RunStatus.COMPLETED


def test_mistakes_and_refusals_advise_commands_that_work(
    cli: Cli, store: afk.Store, tmp_path: Path
) -> None:
    root = str(store.root)
    assert cli_jobs.count_job.with_store(store).run(2, str(tmp_path / "o"), run_id="done") == 1

    # a typo'd run id: the listing it advises
    code, _, err = cli("--root", root, "show", "dnoe")
    assert code == 2
    ((code, listing),) = follow(cli, err)
    assert code == 0 and "done" in listing

    # a fork without --at, and an inspect of a seq that is not there: the checkpoint list
    code, _, err = cli("--root", root, "fork", "done")
    assert code == 2
    ((code, listing),) = follow(cli, err, root=Path(root), RUN="done")
    assert code == 0 and "run_terminal" in listing
    code, _, err = cli("--root", root, "inspect", "done", "99")
    assert code == 2
    ((code, listing),) = follow(cli, err, root=Path(root))
    assert code == 0 and "run_terminal" in listing

    # `submit` and `restart --no-start`: how to start the new run, and how to follow it
    code, out, err = cli("--root", root, "submit", "cli_jobs:count_job", '[2, "x"]')
    assert code == 0, err
    results = follow(cli, out)
    assert [code for code, _ in results] == [0, 0], results
    code, out, err = cli("--root", root, "restart", "done", "--as", "again", "--no-start")
    assert code == 0, err
    assert [code for code, _ in follow(cli, out, root=Path(root))] == [0]
    assert store.read_meta("again").status is afk.RunStatus.COMPLETED

    # a job renamed since the run started: cancel it, as advised
    params = {"args": [2, "x"], "kwargs": {}}
    with store.create("renamed", entrypoint="cli_jobs:gone_job", params=params) as run:
        run.checkpoint("runtime_state", {"state": {}, "cursors": {}}, step=0)
    code, _, err = cli("--root", root, "resume", "renamed")
    assert code != 0 and "cli_jobs:gone_job" in err
    results = follow(cli, err, root=Path(root))
    assert [code for code, _ in results] == [0], results
    assert store.read_meta("renamed").status is afk.RunStatus.CANCELLED

    # a cancelled run called again: fork it from a checkpoint
    interrupted_run(store, "stop", tmp_path / "stop.txt")
    assert cli("--root", root, "cancel", "stop")[0] == 0
    with pytest.raises(afk.RunCancelledError) as cancelled:
        cli_jobs.count_job.with_store(store).run(3, str(tmp_path / "stop.txt"), run_id="stop")
    ((code, out),) = follow(cli, str(cancelled.value), root=Path(root), SEQ="1")
    assert code == 0 and out.startswith("forked stop at seq 1 into "), out
    ((code, out),) = follow(cli, out)  # "continue it with: afk-local ... resume FORK"
    assert code == 0 and out.endswith(f"completed: {cli_jobs.expected_total(3)}\n"), out

    # schedules: the sub-command help, an empty list, and the list a removal points at
    code, out, _ = cli("--root", root, "schedule", "list")
    assert code == 0
    fill = {"NAME": "nightly", "MODULE:FUNCTION": "cli_jobs:count_job"}
    assert [code for code, _ in follow(cli, out, root=Path(root), **fill)] == [0, 0]
    code, _, err = cli("--root", root, "schedule")
    assert code == 2
    assert [code for code, _ in follow(cli, err, root=Path(root))] == [0]
    code, _, err = cli("--root", root, "schedule", "rm", "nigthly")
    assert code == 2
    assert [code for code, _ in follow(cli, err, root=Path(root))] == [0]


def test_a_moved_store_an_imported_run_and_damage_advise_commands_that_work(
    cli: Cli, store: afk.Store, tmp_path: Path
) -> None:
    interrupted_run(store, "cut", tmp_path / "cut.txt")
    assert cli_jobs.count_job.with_store(store).run(2, str(tmp_path / "o"), run_id="done") == 1
    code, exported, _ = cli("--root", str(store.root), "export", "cut")
    assert code == 0
    moved = tmp_path / "moved" / ".afk"
    shutil.copytree(store.root, moved, symlinks=True)

    # a copied store refuses to resume until adopted; adopt then says what of the project
    code, _, err = cli("--root", str(moved), "resume", "cut")
    assert code == 2
    ((code, out),) = follow(cli, err)
    assert code == 0 and "adopted" in out
    ((code, again),) = follow(cli, out)  # "if the scripts moved too: afk-local adopt ..."
    assert code == 0, again
    assert cli("--root", str(moved), "resume", "cut")[0] == 0

    # an imported run is resumed only once trusted: read it first, then --trust
    (tmp_path / "cut.json").write_text(exported)
    other = tmp_path / "other"
    assert cli("--root", str(other), "import", str(tmp_path / "cut.json"))[0] == 0
    code, _, err = cli("--root", str(other), "resume", "cut")
    assert code == 2
    results = follow(cli, err, root=other)
    assert [code for code, _ in results] == [0, 0, 0], results
    assert afk.Store(other).read_meta("cut").status is afk.RunStatus.COMPLETED

    # a damaged checkpoint: runs and verify point at verify and at a fork before it
    newest = max(store.paths("done").dir.glob("*.ckpt"))
    data = bytearray(newest.read_bytes())
    data[-3] ^= 0xFF
    newest.write_bytes(bytes(data))
    code, listing, _ = cli("--root", str(store.root), "runs")
    ((code, verified),) = follow(cli, listing, root=store.root)
    assert code == 1 and f"DAMAGED {newest}" in verified  # verify's documented exit
    seq = str(int(newest.name.split(".")[0]) - 1)
    results = follow(cli, verified, root=store.root, RUN="done", SEQ=seq)
    # the fork before the damage, and the salvage (every intact checkpoint kept)
    assert [code for code, _ in results] == [0, 0], results
    forks = [m.parent_run_id for m in map(store.read_meta, store.run_ids())]
    assert forks.count("done") == 2
