"""The fuzzing loop: draw programs from a seed, play each, shrink the first that fails."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from afk_local.testing.forkserver import using_fork_server
from afk_local.testing.fuzz.execute import run_program
from afk_local.testing.fuzz.program import Program, generate
from afk_local.testing.fuzz.progress import Played

SHRINK_TRIES = 60
"""Programs played at most while shrinking a failure."""


@dataclass(frozen=True)
class Failure:
    """A program that diverged from the model: its seed, what it did, what went wrong."""

    seed: str
    index: int
    problems: tuple[str, ...]
    program: tuple[str, ...]
    """The (shrunk) program, as lines."""
    replay: str = ""
    """The arguments of ``python -m afk_local.testing.fuzz`` that play it again."""

    def text(self) -> str:
        """The failure as a person reads it, with the command that replays it."""
        lines = [
            f"program {self.seed} diverged from the model:",
            *(f"  - {p}" for p in self.problems),
            "shrunk program:",
            *self.program,
            f"replay: python -m afk_local.testing.fuzz {self.replay}",
        ]
        return "\n".join(lines)


@dataclass
class FuzzReport:
    """What :func:`fuzz` played and found."""

    seed: str
    programs: int = 0
    seconds: float = 0.0
    faults: dict[str, int] = field(default_factory=dict)
    """Segments played per kind of fault (``cut``, ``kill``, ``none``)."""
    failures: list[Failure] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no program diverged."""
        return not self.failures


def program_seed(seed: str, index: int) -> str:
    """The seed string of program ``index`` of a run seeded ``seed``."""
    return f"{seed}:{index}"


def fuzz(
    seed: str,
    programs: int,
    *,
    first: int = 0,
    size: int = 5,
    kill_every: int = 10,
    keyed_every: int = 5,
    clock_steps: bool = False,
    stop_at_first: bool = True,
    mutant: str | None = None,
    progress: Callable[[int, FuzzReport], None] | None = None,
    indices: Iterable[int] | None = None,
    on_played: Callable[[Played], None] | None = None,
) -> FuzzReport:
    """Play programs ``first .. first + programs - 1`` of ``seed``; shrink each failure.

    Args:
        size: most instructions per run.
        kill_every: every this-many-th program (0, N, 2N...) SIGKILLs child processes
            (each attempt there costs a fresh interpreter); the rest cut power in this
            process. 0: none does.
        keyed_every: every this-many-th program (1, N + 1...) has a keyed store. 0: none.
        clock_steps: programs may step the wall clock (3 s a step): back at once, or back
            or forward in the middle of the next attempt.
        stop_at_first: stop at the first failing program.
        mutant: a crash explorer kind mutant for the power cuts (the fuzzer must fail).
        progress: called after each program with its index and the report so far.
        indices: play these programs instead of ``first .. first + programs - 1`` (a run
            continued from a progress file plays those it has not played yet).
        on_played: called after each program (shrunk when it failed) with what it did.
    """
    report = FuzzReport(seed)
    started = time.perf_counter()
    with using_fork_server():  # each SIGKILLed child: a fork, not an interpreter's start-up
        _play(
            seed,
            report,
            range(first, first + programs) if indices is None else indices,
            size=size,
            kill_every=kill_every,
            keyed_every=keyed_every,
            clock_steps=clock_steps,
            stop_at_first=stop_at_first,
            mutant=mutant,
            progress=progress,
            on_played=on_played,
        )
    report.seconds = round(time.perf_counter() - started, 3)
    return report


def _play(
    seed: str,
    report: FuzzReport,
    indices: Iterable[int],
    *,
    size: int,
    kill_every: int,
    keyed_every: int,
    clock_steps: bool,
    stop_at_first: bool,
    mutant: str | None,
    progress: Callable[[int, FuzzReport], None] | None,
    on_played: Callable[[Played], None] | None,
) -> None:
    """The loop of :func:`fuzz`: play each program of ``indices``, into ``report``."""
    for index in indices:
        began = time.perf_counter()
        kills = kill_every > 0 and index % kill_every == 0
        keyed = keyed_every > 0 and index % keyed_every == 1 % keyed_every
        program = generate(
            program_seed(seed, index), size=size, kills=kills, keyed=keyed, clock_steps=clock_steps
        )
        for segment in program.segments:
            report.faults[segment.fault] = report.faults.get(segment.fault, 0) + 1
        problems = run_program(program, mutant=mutant)
        report.programs += 1
        if problems:
            small, small_problems = shrink(program, problems, mutant=mutant)
            replay = (
                f"--seed {seed} --program {index} --size {size} --kill-every {kill_every} "
                f"--keyed-every {keyed_every}{' --clock-steps' if clock_steps else ''}"
            )
            if mutant is not None:
                replay += f" --mutant {mutant}"
            report.failures.append(
                Failure(program.seed, index, tuple(small_problems), tuple(small.describe()), replay)
            )
        if on_played is not None:
            failure = report.failures[-1] if problems else None
            on_played(
                Played(
                    index,
                    program.seed,
                    "diverged" if failure else "passed",
                    round(time.perf_counter() - began, 3),
                    list(failure.problems + failure.program) if failure else [],
                    failure.replay if failure else "",
                )
            )
        if progress is not None:
            progress(index, report)
        if report.failures and stop_at_first:
            break


def shrink(
    program: Program, problems: list[str], *, mutant: str | None = None
) -> tuple[Program, list[str]]:
    """A smaller program that still diverges: leave out one action or instruction at a
    time while the program still fails (at most :data:`SHRINK_TRIES` plays)."""
    tries = 0
    improved = True
    while improved and tries < SHRINK_TRIES:
        improved = False
        for candidate in _smaller(program):
            tries += 1
            found = run_program(candidate, mutant=mutant)
            if found:
                program, problems, improved = candidate, found, True
                break
            if tries >= SHRINK_TRIES:
                break
    return program, problems


def _smaller(program: Program) -> list[Program]:
    out = [
        program.without(s, a)
        for s, segment in enumerate(program.segments)
        for a in range(len(segment.actions))
        if len(program.segments) > 1 or len(segment.actions) > 1
    ]
    out += [
        program.without_instruction(r, i)
        for r, spec in enumerate(program.runs)
        for i in range(len(spec.instructions))
        if len(spec.instructions) > 1
    ]
    return out


__all__ = ["SHRINK_TRIES", "Failure", "FuzzReport", "fuzz", "program_seed", "shrink"]
