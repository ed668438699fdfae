"""Effects a crash left in doubt, handled from the command line: settle, or resume --in-doubt retry.

A real child is SIGKILLed inside a non-idempotent step (after its side effect, before
its outcome is journaled). The CLI then runs in this process (``afk_local.cli.main``):
the process boundary that matters is the crash.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import cli_jobs
import proc
import pytest
from proc import SUPPORT

import afk_local as afk
from afk_local.cli import main
from afk_local.journal.replay import idempotency_key

CRASH_IN_STEP = """
import sys
import cli_jobs
import afk_local as afk
cli_jobs.charge_job.with_store(afk.Store(sys.argv[1])).run(sys.argv[2], 5, run_id=sys.argv[3])
"""


@pytest.fixture
def in_process(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``afk-local resume`` may go to the job's directory and extend sys.path: undone after."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))


def crash_in_doubt(root: Path, outside: Path, run_id: str) -> None:
    env = {
        "PYTHONPATH": str(SUPPORT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "CLI_JOBS_DIE_IN_STEP": "1",
    }
    done = proc.run(CRASH_IN_STEP, str(root), str(outside), run_id, env=env)
    assert done.returncode == -9, done.stderr
    assert afk.Store(root).open(run_id).effects()[-1].kind == "intent"  # in doubt


def charges(outside: Path) -> int:
    return outside.read_text().count("charged 5")


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_settle_done_replays_the_given_result(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], in_process: None
) -> None:
    root, outside = tmp_path / "store", tmp_path / "outside.txt"
    crash_in_doubt(root, outside, "pay")
    r = str(root)

    code, out, err = run_cli(capsys, "--root", r, "resume", "pay")
    # the run is failed now, and the message says what a person can do, in CLI terms
    assert (code, out) == (1, "")
    key = idempotency_key("pay", "charge#1")
    assert err.splitlines()[0] == (
        f"afk-local: run 'pay': effect 'charge#1' was started but has no recorded outcome "
        "(its process died or was killed, was stopped at once by a second Ctrl-C, or the "
        "result it returned could not be stored): it may or may not have happened. Check "
        "the outside system for "
        f"idempotency key {key!r}, then record what happened with `afk-local --root {r} "
        f"settle pay 'charge#1' --done --result JSON` (JSON: what it returned; or --failed "
        f"'it did not happen') and resume, or call it again with `afk-local --root {r} resume "
        "pay --in-doubt retry`"
    )
    assert err.splitlines()[1] == f"afk-local: see `afk-local --root {r} show pay`"
    assert afk.Store(root).read_meta("pay").status is afk.RunStatus.FAILED
    assert charges(outside) == 1

    code, out, _ = run_cli(capsys, "--root", r, "effects", "pay")
    assert code == 0
    lines = out.splitlines()
    assert "IN DOUBT" in lines[1]  # in doubt first
    assert f"  charge#1  (idempotency key {key})" in lines
    code, out, _ = run_cli(
        capsys,
        "--root",
        r,
        "settle",
        "pay",
        "charge#1",
        "--done",
        "--result",
        '"by hand"',
        "--json",
    )
    assert code == 0
    assert json.loads(out) == {
        "run_id": "pay",
        "key": "charge#1",
        "settled": "done",
        "result": "by hand",
        "error": None,
    }

    code, out, err = run_cli(capsys, "--root", r, "resume", "pay", "--json")  # a failed run
    assert code == 0, err
    assert json.loads(out) == {
        "run_id": "pay",
        "status": "completed",
        "result": {"receipt": "by hand"},
    }
    assert charges(outside) == 1  # replayed with the settled result, never called again

    code, out, err = run_cli(
        capsys, "--root", r, "settle", "pay", "charge#1", "--done", "--result", "null"
    )
    assert (code, out) == (2, "")
    assert err == (
        "afk-local: run 'pay': cannot settle: effect 'charge#1' is not in doubt: its outcome "
        "is recorded (ok), so there is nothing to settle\n"
    )
    code, out, err = run_cli(capsys, "--root", r, "settle", "pay", "nope#1", "--failed", "x")
    assert (code, out) == (2, "")
    assert err == (
        "afk-local: run 'pay': cannot settle: the run has no effect 'nope#1': run "
        "`afk-local effects pay` to list them\n"
    )


def test_the_printed_settle_failed_command_works_and_the_call_runs_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], in_process: None
) -> None:
    root, outside = tmp_path / "store", tmp_path / "outside.txt"
    crash_in_doubt(root, outside, "pay")
    code, out, _ = run_cli(capsys, "--root", str(root), "effects", "pay")
    assert code == 0
    hint = next(line for line in out.splitlines() if "it did not:" in line)
    command = shlex.split(hint.split("it did not:", 1)[1])
    assert command[0] == "afk-local"
    code, out, err = run_cli(capsys, *command[1:])  # exactly what was printed
    assert code == 0, err
    assert out.startswith("run pay: effect charge#1 settled as failed; a resume calls it again")
    assert afk.Store(root).open("pay").effects()[-1].error.message == "it did not happen"

    code, out, err = run_cli(capsys, "--root", str(root), "resume", "pay")
    assert code == 0, err
    assert out == 'run pay completed: {"receipt": "receipt-5"}\n'
    assert charges(outside) == 2  # called again, as the person said it had not happened


def test_resume_in_doubt_retry_calls_it_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], in_process: None
) -> None:
    root, outside = tmp_path / "store", tmp_path / "outside.txt"
    crash_in_doubt(root, outside, "pay")
    code, out, err = run_cli(
        capsys, "--root", str(root), "resume", "pay", "--in-doubt", "retry", "--json"
    )
    assert code == 0, err
    assert json.loads(out)["result"] == {"receipt": "receipt-5"}
    assert charges(outside) == 2

    crash_in_doubt(root, outside, "pay2")
    code, out, err = run_cli(capsys, "--root", str(root), "resume", "pay2", "--in-doubt", "raise")
    assert code == 1 and "has no recorded outcome" in err
    assert cli_jobs.charge_job.entrypoint == afk.Store(root).read_meta("pay2").entrypoint


def test_settle_undo_settle_again_then_resume_replays_the_last_answer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], in_process: None
) -> None:
    root, outside = tmp_path / "store", tmp_path / "outside.txt"
    crash_in_doubt(root, outside, "pay")
    r = str(root)

    # --done without a result is refused: a forgotten result is never replayed as null
    code, out, err = run_cli(capsys, "--root", r, "settle", "pay", "charge#1", "--done")
    assert (code, out) == (2, "")
    assert "--done needs what the call returned" in err
    assert "settle pay 'charge#1' --done --result JSON" in err
    assert afk.Store(root).open("pay").effects()[-1].kind == "intent"  # nothing recorded

    code, out, _ = run_cli(
        capsys, "--root", r, "settle", "pay", "charge#1", "--done", "--result", '"wrong"'
    )
    assert code == 0
    assert f"afk-local --root {r} settle pay 'charge#1' --undo" in out
    code, out, err = run_cli(capsys, "--root", r, "settle", "pay", "charge#1", "--undo")
    assert code == 0, err
    assert "in doubt again" in out
    code, out, _ = run_cli(capsys, "--root", r, "effects", "pay", "--json")
    assert [row["state"] for row in json.loads(out)] == ["in_doubt"]
    code, out, err = run_cli(capsys, "--root", r, "settle", "pay", "charge#1", "--undo")
    assert code == 2
    assert "is in doubt already" in err

    result_file = tmp_path / "result.json"
    result_file.write_text('"right"')
    code, out, err = run_cli(
        capsys,
        "--root",
        r,
        "settle",
        "pay",
        "charge#1",
        "--done",
        "--result-file",
        str(result_file),
    )
    assert code == 0, err
    code, out, err = run_cli(capsys, "--root", r, "resume", "pay", "--json")
    assert code == 0, err
    assert json.loads(out)["result"] == {"receipt": "right"}  # the last answer
    assert charges(outside) == 1

    # a resume used the settlement: it stands
    code, out, err = run_cli(capsys, "--root", r, "settle", "pay", "charge#1", "--undo")
    assert code == 2
    assert "a resume has started since" in err


def test_settle_done_with_an_explicit_null_records_null(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], in_process: None
) -> None:
    root, outside = tmp_path / "store", tmp_path / "outside.txt"
    crash_in_doubt(root, outside, "pay")
    code, _, err = run_cli(
        capsys, "--root", str(root), "settle", "pay", "charge#1", "--done", "--result", "null"
    )
    assert code == 0, err
    outcome = afk.Store(root).open("pay").effects()[-1]
    assert (outcome.kind, outcome.status, outcome.result, outcome.settled_attempt) == (
        "outcome",
        "ok",
        None,
        1,
    )
    with pytest.raises(afk.SettleError, match="needs the result"):
        afk.settle("pay", "charge#1", store=afk.Store(root), done=True)
