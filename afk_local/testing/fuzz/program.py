"""Random programs: runs of the interpreter jobs, store operations, and where faults strike.

A :class:`Program` is drawn from a seed string (``"<seed>:<index>"``), so a program is
named by its seed and index and replays identically. It has

- runs (:class:`RunSpec`): a run id, a durability mode and the instructions its job
  interprets (:mod:`.jobs`);
- segments (:class:`Segment`): actions in order (an attempt of a run, ``busy`` (an
  attempt with ``gc`` and ``verify`` running beside it), ``gc``, ``pack``, ``fork``,
  ``export`` (and import), ``verify``, ``rm``, in programs with kills ``watch`` (the
  watcher resuming what is interrupted), with clock steps ``clock`` (a step of the wall
  clock now or in the middle of the next attempt)), each segment under one kind of
  fault: ``cut`` (recorded in this process, then a power cut at a random point of the
  recording, as the crash explorer models one), ``kill`` (attempts run in child
  processes SIGKILLed at a random durable I/O call) or ``none``.

:func:`expected_result` is the reference model of a run's result: what every run of
those instructions, however often interrupted, must return.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Any

from afk_local.testing.fuzz.jobs import answer_for, value_of

_INSTRUCTIONS = (
    ("step", 5),
    ("istep", 1),
    ("flaky", 1),
    ("iterate", 2),
    ("checkpoint", 1),
    ("sleep", 1),
    ("park", 1),
    ("pause", 1),
)
_ACTIONS = (
    ("attempt", 6),
    ("busy", 1),
    ("gc", 1),
    ("pack", 1),
    ("fork", 1),
    ("export", 1),
    ("verify", 1),
    ("rm", 1),
)
KILL_AT_MAX = 80
"""A killed attempt dies before one of its first this-many durable I/O calls."""


@dataclass(frozen=True)
class RunSpec:
    """One run of a program: its id, its job's durability mode and its instructions."""

    run_id: str
    mode: str
    instructions: tuple[tuple[Any, ...], ...]

    def program(self) -> list[list[Any]]:
        """The instructions as the job takes them (plain lists)."""
        return [list(i) for i in self.instructions]


@dataclass(frozen=True)
class Action:
    """One thing a program does: ``kind`` to run ``run`` (an index), with ``arg``."""

    kind: str
    run: int = 0
    arg: int = 0
    kill_at: int | None = None
    """In a ``kill`` segment, an attempt's child is killed before this durable I/O call."""

    def describe(self, runs: tuple[RunSpec, ...]) -> str:
        """One line for a report."""
        where = f" kill@{self.kill_at}" if self.kill_at else ""
        return f"{self.kind}({runs[self.run].run_id}, {self.arg}){where}"


@dataclass(frozen=True)
class Segment:
    """Actions run under one kind of fault (``none``, ``kill`` or ``cut``)."""

    fault: str
    actions: tuple[Action, ...]


@dataclass(frozen=True)
class Program:
    """A generated program (module docstring); ``seed`` names it."""

    seed: str
    runs: tuple[RunSpec, ...]
    segments: tuple[Segment, ...]
    keyed: bool = False
    """The store is keyed: signed files and head records (lost at a power cut, as they are
    kept outside the store and never fsynced)."""
    clock_steps: bool = False
    """Actions may step this process's wall clock back 3 s (``clock``)."""

    def describe(self) -> list[str]:
        """The program as lines a person reads."""
        lines = [f"program {self.seed}{' (keyed store)' if self.keyed else ''}"]
        for spec in self.runs:
            body = ", ".join(":".join(str(p) for p in i) for i in spec.instructions)
            lines.append(f"  run {spec.run_id} ({spec.mode}): {body}")
        for number, segment in enumerate(self.segments):
            actions = "; ".join(a.describe(self.runs) for a in segment.actions)
            lines.append(f"  segment {number} [{segment.fault}]: {actions}")
        return lines

    def without(self, segment: int, action: int) -> Program:
        """This program with one action left out (to shrink a failing program)."""
        segments = list(self.segments)
        kept = segments[segment].actions[:action] + segments[segment].actions[action + 1 :]
        segments[segment] = replace(segments[segment], actions=kept)
        return replace(self, segments=tuple(s for s in segments if s.actions))

    def without_instruction(self, run: int, index: int) -> Program:
        """This program with one instruction of one run left out."""
        runs = list(self.runs)
        spec = runs[run]
        runs[run] = replace(
            spec, instructions=spec.instructions[:index] + spec.instructions[index + 1 :]
        )
        return replace(self, runs=tuple(runs))


def _weighted(rng: random.Random, table: tuple[tuple[str, int], ...]) -> str:
    return rng.choices([name for name, _ in table], [weight for _, weight in table])[0]


def _instructions(rng: random.Random, size: int) -> tuple[tuple[Any, ...], ...]:
    out: list[tuple[Any, ...]] = []
    for j in range(rng.randint(1, size)):
        op = _weighted(rng, _INSTRUCTIONS)
        name = f"{op}{j}"
        if op in ("step", "istep", "flaky"):
            out.append((op, name, rng.randint(0, 99)))
        elif op == "iterate":
            out.append((op, name, rng.randint(1, 3)))
        else:
            out.append((op, name))
    return tuple(out)


def generate(
    seed: str, *, size: int = 5, kills: bool = False, keyed: bool = False, clock_steps: bool = False
) -> Program:
    """The program of ``seed`` (``"<seed>:<index>"``).

    Args:
        size: most instructions a run has (and, plus one, most actions after each
            run's first attempt); above 3, up to three runs.
        kills: some segments (the first always) SIGKILL child processes (each attempt
            there costs a fresh interpreter); without, segments cut power or have no fault.
        keyed: the program's store is keyed.
        clock_steps: some actions step the wall clock (``clock``): back now, or back or
            forward in the middle of the next attempt.
    """
    rng = random.Random(seed)
    runs = tuple(
        RunSpec(
            f"r{i}",
            _weighted(rng, (("sync", 6), ("async", 2), ("exit", 2))),
            _instructions(rng, size),
        )
        for i in range(rng.choice((1, 1, 2, 2, 3) if size > 3 else (1, 1, 2)))
    )
    actions = [Action("attempt", i) for i in range(len(runs))]
    rng.shuffle(actions)
    table = (*_ACTIONS, ("clock", 2)) if clock_steps else _ACTIONS
    if kills:  # the watcher's children are processes too
        table = (*table, ("watch", 1))
    for _ in range(rng.randint(1, size + 1)):
        actions.append(Action(_weighted(rng, table), rng.randrange(len(runs)), rng.randrange(1000)))
    cuts = sorted(rng.sample(range(1, len(actions)), min(rng.randint(0, 2), len(actions) - 1)))
    segments: list[Segment] = []
    for start, end in zip([0, *cuts], [*cuts, len(actions)], strict=True):
        fault = "cut" if rng.random() < 0.7 else "none"
        if kills and (not segments or rng.random() < 0.6):
            fault = "kill"
        chosen = actions[start:end]
        if fault == "kill":
            chosen = [
                replace(a, kill_at=rng.randint(1, KILL_AT_MAX))
                if a.kind in ("attempt", "busy")
                else a
                for a in chosen
            ]
        segments.append(Segment(fault, tuple(chosen)))
    return Program(seed, runs, tuple(segments), keyed, clock_steps)


def expected_result(instructions: tuple[tuple[Any, ...], ...]) -> dict[str, Any]:
    """What every run of ``instructions`` returns, however often it was interrupted."""
    top: list[str] = []
    acc: list[str] = []
    for instruction in instructions:
        op, name = instruction[0], instruction[1]
        if op in ("step", "istep", "flaky"):
            top.append(value_of(name, instruction[2]))
        elif op == "iterate":
            acc += [value_of(f"{name}.{i}", i) for i in range(instruction[2])]
        elif op == "pause":
            top.append(answer_for(name))
    return {"top": top, "acc": acc}


def effect_names(instructions: tuple[tuple[Any, ...], ...]) -> list[str]:
    """The names of every side effect a run of ``instructions`` must have made."""
    names: list[str] = []
    for instruction in instructions:
        op, name = instruction[0], instruction[1]
        if op in ("step", "istep", "flaky"):
            names.append(name)
        elif op == "iterate":
            names += [f"{name}.{i}" for i in range(instruction[2])]
    return names


__all__ = [
    "KILL_AT_MAX",
    "Action",
    "Program",
    "RunSpec",
    "Segment",
    "effect_names",
    "expected_result",
    "generate",
]
