"""The whole-program fuzzer: random programs under SIGKILLs and power cuts agree with the model.

The default run plays 200 small programs drawn from the day's seed (``AFK_KILL_SEED``,
printed in the header: set it to replay), every 50th with SIGKILLed children (job
attempts, and ``afk-local`` store commands), the rest with power cuts, every 5th in a
keyed store; ``--torture`` plays 10,000 larger ones, every third with kills. Each
kind mutant of the crash explorer, applied to the power cuts, must make the fuzzer
diverge: it would notice a library without that fsync.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import proc
import pytest
from conftest import KILL_SEED

from afk_local.testing.crashsim import MUTANTS
from afk_local.testing.fuzz import fuzz, generate, run_program, shrink
from afk_local.testing.fuzz.__main__ import main
from afk_local.testing.fuzz.execute import Execution
from afk_local.testing.fuzz.program import Action, Program, RunSpec, Segment, expected_result


def test_random_programs_agree_with_the_model(request: pytest.FixtureRequest, trials) -> None:
    torture = bool(request.config.getoption("--torture"))
    report = fuzz(
        f"test-{KILL_SEED}",
        trials(200, 10_000),
        size=5 if torture else 3,
        kill_every=3 if torture else 50,  # each SIGKILLed attempt is a fresh interpreter
        keyed_every=5,
    )
    assert report.ok, report.failures[0].text()
    assert report.faults.get("cut", 0) >= 100  # faults really struck
    assert report.faults.get("kill", 0) >= 1


@pytest.mark.parametrize("mutant", list(MUTANTS))
def test_the_fuzzer_notices_a_library_without_an_fsync(mutant: str) -> None:
    report = fuzz("mutants", 60, size=3, kill_every=0, mutant=mutant)
    assert not report.ok, f"{mutant}: 60 programs and no divergence"
    failure = report.failures[0]
    assert f"--seed mutants --program {failure.index} " in failure.text()


def test_programs_whose_clock_steps_back_in_keyed_stores_agree_with_the_model() -> None:
    report = fuzz(f"clock-{KILL_SEED}", 20, size=4, kill_every=0, keyed_every=1, clock_steps=True)
    assert report.ok, report.failures[0].text()


def test_a_failing_program_shrinks_and_still_fails() -> None:
    failures = fuzz("mutants", 60, size=3, kill_every=0, mutant="no-journal-fsync").failures
    # Replayed alone, a program's recorded I/O can come in another order (an async run's
    # threads), so its cut may fall elsewhere: take the first failure that fails again.
    problems: list[str] = []
    for failure in failures:
        program = generate(f"mutants:{failure.index}", size=3)
        problems = run_program(program, mutant="no-journal-fsync")
        if problems:
            break
    assert problems, f"none of {len(failures)} failing programs failed when replayed"
    small, still = shrink(program, problems, mutant="no-journal-fsync")
    assert still
    assert sum(len(s.actions) for s in small.segments) <= sum(
        len(s.actions) for s in program.segments
    )


def test_a_program_is_named_by_its_seed() -> None:
    assert generate("s:7") == generate("s:7")
    assert generate("s:7") != generate("s:8")


def test_a_power_cut_in_the_middle_of_a_run_with_every_instruction_recovers() -> None:
    every = (
        ("step", "step0", 3),
        ("istep", "istep1", 4),
        ("flaky", "flaky2", 5),
        ("iterate", "iterate3", 3),
        ("checkpoint", "checkpoint4"),
        ("sleep", "sleep5"),
        ("park", "park6"),
        ("pause", "pause7"),
    )
    for mode in ("sync", "async", "exit"):
        for cut in range(8):  # each seed puts the cut somewhere else
            program = Program(
                f"every-{mode}-{cut}",
                (RunSpec("r0", mode, every),),
                (
                    Segment("cut", (Action("attempt"), Action("attempt"), Action("fork"))),
                    Segment("cut", (Action("attempt"), Action("gc"), Action("export"))),
                ),
            )
            assert run_program(program) == [], program.describe()


def test_the_model_result_of_a_program() -> None:
    assert expected_result(
        (("step", "a", 1), ("iterate", "b", 2), ("pause", "c"), ("checkpoint", "d"))
    ) == {"top": ["a=8", "answer:c"], "acc": ["b.0=1", "b.1=8"]}


def test_the_command_prints_its_seed_and_replays_one_program(capsys) -> None:
    assert main(["--seed", "cli", "--programs", "2", "--size", "2", "--kill-every", "0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("fuzz seed cli: 2 programs from 0")
    assert "0 diverged" in out
    assert main(["--seed", "cli", "--program", "1", "--kill-every", "0"]) == 0
    assert "1 programs from 1" in capsys.readouterr().out
    code = main(["--seed", "mutants", "--programs", "40", "--size", "3", "--kill-every", "0",
                 "--mutant", "no-journal-fsync"])  # fmt: skip
    assert code == 1
    out = capsys.readouterr().out
    replay = out.split("replay: python -m afk_local.testing.fuzz ")[1].splitlines()[0]
    assert replay.startswith("--seed mutants --program ")
    assert main(replay.split()) == 1  # the printed command plays the failure again
    assert "1 diverged" in capsys.readouterr().out


def test_the_watcher_resumes_runs_a_sigkill_interrupted_and_they_agree_with_the_model(
    tmp_path: Path,
) -> None:
    """A real ``afk-local watch --once`` child is the resumer: each run's attempt is
    SIGKILLed mid-run, then the watcher finishes them (its own children) with their
    model results, before the liveness phase would (idempotent steps: nothing is left
    in doubt, which the watcher would rightly stop at)."""
    steps = (("istep", "istep0", 3), ("iterate", "iterate1", 2), ("istep", "istep2", 4))
    program = Program(
        "watcher",
        (RunSpec("r0", "sync", steps),),  # killed after its run exists, before it ends
        (Segment("kill", (Action("attempt", 0, kill_at=20),)), Segment("none", (Action("watch"),))),
    )
    execution = Execution(program, tmp_path)
    assert execution.play() == []
    assert execution.watched == ["r0"]


def test_gc_and_verify_running_beside_attempts_agree_with_the_model() -> None:
    """Every attempt of these programs has gc and verify of the whole store running in a
    thread beside it (a person's afk-local gc and verify during a run), under power cuts
    that fall anywhere in the interleaving."""
    every = (("step", "step0", 3), ("iterate", "iterate1", 3), ("checkpoint", "c2"))
    for mode in ("sync", "async", "exit"):
        for cut in range(1):  # the seed puts the cut somewhere else
            program = Program(
                f"busy-{mode}-{cut}",
                (RunSpec("r0", mode, every), RunSpec("r1", "sync", every)),
                (
                    Segment("cut", (Action("busy", 0, 1), Action("busy", 1, 2))),
                    Segment("cut", (Action("busy", 0, 5), Action("busy", 1, 4))),
                ),
            )
            assert run_program(program) == [], program.describe()


def test_a_run_with_progress_killed_mid_run_goes_on_without_replaying_or_skipping(
    tmp_path: Path, capsys
) -> None:
    """A real fuzzer process, SIGKILLed while it writes its third program's line, is
    started again with the same file: it plays the programs the file lacks (the torn
    one again), none twice, and the whole run's summary counts every program once."""
    book = tmp_path / "fuzz" / "progress.jsonl"
    args = ["--seed", "progress", "--programs", "6", "--size", "2", "--kill-every", "0",
            "--progress", str(book)]  # fmt: skip
    script = "import sys; sys.path.insert(0, sys.argv.pop(1)); import fuzz_progress_child; " \
        "fuzz_progress_child.main()"  # fmt: skip
    support = str(Path(__file__).parent.parent / "support")
    killed = proc.run(script, support, "3", *args)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    lines = book.read_bytes().split(b"\n")
    assert len(lines) == 4 and lines[-1]  # settings, programs 0 and 1, a torn line
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "6 programs, 2 played already" in out and "4 to play" in out
    assert "4 programs in" in out  # 2, 3, 4, 5
    assert "whole run: seed progress: 6 of 6 programs played, 0 diverged" in out
    played = [json.loads(line) for line in book.read_text().splitlines()[1:]]
    assert [p["index"] for p in played] == [0, 1, 2, 3, 4, 5]
    assert [p["seed"] for p in played] == [f"progress:{i}" for i in range(6)]
    assert {p["outcome"] for p in played} == {"passed"}
    assert oct(book.stat().st_mode & 0o777) == "0o600"
    assert main([*args[:3], "7", *args[4:]]) == 2  # another run's settings: refused
