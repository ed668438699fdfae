"""Record a workload, replay it onto the disk model, build crash states and check them.

:func:`explore` is the whole explorer for one workload: record it in a temporary
directory (checking afterwards that the model of the disk matches the real disk,
so no write escaped :mod:`afk_local.storage.fsio`), then for every call of the
trace take the crash states the model allows, build each as a real directory
tree, and check it (:mod:`.check`) until one fails or the budget is spent.

A mutant makes the model treat one kind of fsync as never made (``no-file-fsync``,
``no-dir-fsync``, ``no-journal-fsync``): the crash states are then exactly those
of a library without that durability step, while the code that runs stays the
real one. Each mutant must produce a counterexample.

With a budget (``max_states``) the states are taken in this order, identical
trees merged (trees that differ only inside unpublished ``.tmp-*`` entries count
as one): at every call the state that loses everything unsynced, then the one
that keeps everything, then those that lose or keep one thing at a time, then
states drawn at random (seeded). Without a budget, every distinct tree of every
call (at most :data:`FULL_CAP` states per call, drawn at random beyond that).
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from afk_local.storage import fsio
from afk_local.testing.crashsim.check import check_state
from afk_local.testing.crashsim.disk import (
    Tree,
    read_tree,
    tree_differences,
    tree_digest,
    write_tree,
)
from afk_local.testing.crashsim.jobs import use_probe
from afk_local.testing.crashsim.model import Choice, DiskModel, Frontier
from afk_local.testing.crashsim.trace import Recorder, RecordingError, Session, Trace
from afk_local.testing.crashsim.workloads import WORKLOADS, Workload

MUTANTS: dict[str, str] = {
    "no-file-fsync": "file",
    "no-dir-fsync": "dir",
    "no-journal-fsync": "journal",
}
"""Mutant name -> the kind of fsync it removes (a file's data, a directory's entries,
``effects.log`` appends)."""

DEFAULT_MAX_STATES = 150
"""Crash states checked per workload by default (the bounded run of CI and the test suite)."""

FULL_CAP = 4096
"""A full exploration checks at most this many states per call (drawn at random beyond)."""

_RANDOM_DRAWS_PER_CALL = 40
"""With a budget: random states drawn per crash point after the structured ones (a draw
that repeats a known tree costs no check), unless the budget runs out first."""


@dataclass(frozen=True)
class Counterexample:
    """A crash state that does not recover: where the crash was, what it lost, what broke."""

    workload: str
    mutant: str | None
    call: int
    """The crash came right after this many recorded calls."""
    op: str
    """That call as a person reads it (``#12 rename a -> b``)."""
    lost: tuple[str, ...]
    """Calls whose effect the crash dropped, and files it cut short."""
    problems: tuple[str, ...]
    """What the new process found lost or broken."""
    ignored: tuple[str, ...] = ()
    """The fsyncs the mutant removed before the crash."""


@dataclass(frozen=True)
class Exploration:
    """The result of exploring one workload."""

    workload: str
    mutant: str | None
    seed: int
    max_states: int | None
    calls: int
    """Durable I/O calls recorded."""
    crash_points: int
    """Places a crash was put: before the first call and after each."""
    combinations: int
    """Crash states the model allows, summed over the crash points (before merging equal trees)."""
    states: int
    """Distinct crash states built and checked."""
    removed: int
    """fsyncs the mutant removed from the trace (0 without a mutant: it changes nothing)."""
    seconds: float
    counterexample: Counterexample | None

    @property
    def ok(self) -> bool:
        """True when every checked state recovered."""
        return self.counterexample is None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form."""
        return {**asdict(self), "ok": self.ok}


def record(workload: Workload, base: Path, scratch: Path) -> tuple[Tree, Trace]:
    """Run ``workload`` in ``base`` with every durable I/O call recorded.

    Returns the tree before the recorded part (all of it durable) and the trace.

    Raises:
        RecordingError: the model replayed from the trace does not match the disk.
    """
    store = workload.store(base / "store")
    prepared = workload.setup(store, scratch)
    initial = read_tree(base)
    recorder = Recorder(base)
    session = Session(base, store, recorder)
    previous_probe = use_probe(session)
    previous = fsio.set_io_recorder(recorder)
    try:
        workload.record(session, prepared)
    finally:
        fsio.set_io_recorder(previous)
        use_probe(previous_probe)
    trace = Trace(tuple(recorder.ops), tuple(session.acks), tuple(session.calls))
    model = DiskModel(initial)
    for op in trace.ops:
        model.apply(op)
    trash = fsio.TEMP_PREFIX + "deleted-"  # removed by rmtree once unpublished: not durable I/O
    expected = {p: n for p, n in model.tree().items() if trash not in p}
    differences = tree_differences(expected, read_tree(base), ignore=("owner.lock",))
    if differences:
        raise RecordingError(
            f"workload {workload.name}: the disk differs from the recorded calls (a write that "
            f"bypassed afk_local.storage.fsio?): {'; '.join(differences[:5])}"
        )
    return initial, trace


def _candidates(
    frontiers: list[Frontier], max_states: int | None, rng: random.Random
) -> Iterator[tuple[Frontier, Choice]]:
    if max_states is None:
        for frontier in frontiers:
            total = frontier.combinations
            if total <= FULL_CAP:
                indices: list[int] | range = range(total)
            else:
                indices = sorted({0, total - 1, *rng.sample(range(total), FULL_CAP - 2)})
            for index in indices:
                yield frontier, frontier.choice(index)
        return
    for frontier in frontiers:
        yield frontier, frontier.choice(0)
    for frontier in frontiers:
        yield frontier, frontier.choice(frontier.combinations - 1)
    for frontier in frontiers:
        for choice in frontier.variants():
            yield frontier, choice
    for _ in range(_RANDOM_DRAWS_PER_CALL * len(frontiers)):
        frontier = rng.choice(frontiers)
        yield frontier, frontier.random_choice(rng)


def explore(
    workload: str | Workload,
    *,
    mutant: str | None = None,
    max_states: int | None = DEFAULT_MAX_STATES,
    seed: int = 0,
) -> Exploration:
    """Explore the crash states of one workload; stop at the first that does not recover.

    Args:
        workload: a name from :data:`~afk_local.testing.crashsim.WORKLOADS`, or a Workload.
        mutant: a name from :data:`MUTANTS`, or None for the library as it is.
        max_states: distinct crash states to check at most; None checks them all.
        seed: seeds the random part of the choice of states.

    Example:
        >>> explore("sync", max_states=20).ok  # doctest: +SKIP
        True
    """
    chosen = WORKLOADS[workload] if isinstance(workload, str) else workload
    if mutant is not None and mutant not in MUTANTS:
        raise ValueError(f"unknown mutant {mutant!r}: choose one of {', '.join(MUTANTS)}")
    started = time.perf_counter()
    rng = random.Random(f"{seed}:{chosen.name}")
    with tempfile.TemporaryDirectory(
        prefix=f"afk-crashsim-{chosen.name}-", dir=_scratch_root()
    ) as tmp:
        work = Path(tmp)
        (work / "base").mkdir()
        (work / "scratch").mkdir()
        initial, trace = record(chosen, work / "base", work / "scratch")
        ignored = frozenset({MUTANTS[mutant]}) if mutant is not None else frozenset()
        model = DiskModel(initial, ignored_fsyncs=ignored)
        frontiers = [model.frontier(0)]
        for op in trace.ops:
            model.apply(op)
            frontiers.append(model.frontier(op.index, op))
        promised = [(trace.acks_at(f.at), trace.calls_at(f.at)) for f in frontiers]
        seen: set[tuple[str, int, int]] = set()
        states = 0
        found = None
        for frontier, choice in _candidates(frontiers, max_states, rng):
            acks, calls = promised[frontier.at]
            tree = frontier.tree(choice)
            digest = tree_digest(tree, temporaries_by_name=max_states is not None)
            key = (digest, len(acks), len(calls))
            if key in seen:
                continue
            seen.add(key)
            states += 1
            problems = _check(tree, work / "state", chosen, acks, calls)
            if problems:
                found = Counterexample(
                    workload=chosen.name,
                    mutant=mutant,
                    call=frontier.at,
                    op=frontier.op.describe() if frontier.op else "#0 (before the first)",
                    lost=tuple(frontier.lost(choice)),
                    problems=tuple(problems),
                    ignored=tuple(op.describe() for op in model.ignored if op.index <= frontier.at),
                )
                break
            if max_states is not None and states >= max_states:
                break
    return Exploration(
        workload=chosen.name,
        mutant=mutant,
        seed=seed,
        max_states=max_states,
        calls=len(trace.ops),
        crash_points=len(frontiers),
        combinations=sum(f.combinations for f in frontiers),
        states=states,
        removed=len(model.ignored),
        seconds=round(time.perf_counter() - started, 3),
        counterexample=found,
    )


def _scratch_root() -> str | None:
    """A memory-backed temp directory when there is one: crash states are built and
    resumed by the thousand, and a disk's fsyncs and unlinks would dominate the run
    (what is checked is what a new process makes of the files, not the disk)."""
    shm = "/dev/shm"  # noqa: S108 - a private directory is made inside it
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None


def _check(tree: Tree, root: Path, workload: Workload, acks: Any, calls: Any) -> list[str]:
    write_tree(tree, root)
    try:
        problems = check_state(root, workload, acks, calls)
    except Exception as exc:  # anything unexpected from opening a crash state is a finding
        problems = [f"checking raised {type(exc).__name__}: {exc}"]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    prefix = str(root) + os.sep  # name files as the trace does, relative to the state
    return [problem.replace(prefix, "") for problem in problems]


__all__ = [
    "DEFAULT_MAX_STATES",
    "FULL_CAP",
    "MUTANTS",
    "Counterexample",
    "Exploration",
    "explore",
    "record",
]
