"""Record a workload, replay it onto the disk model, build crash states and check them.

:func:`explore` is the whole explorer for one workload: record it in a temporary
directory (checking afterwards that the model of the disk matches the real disk,
so no write escaped :mod:`afk_local.storage.fsio`), then for every call of the
trace take the crash states the model allows, build each as a real directory
tree, and check it (:mod:`.check`) until one fails or the budget is spent.

A mutant makes the model treat one kind of fsync as never made (``no-file-fsync``,
``no-dir-fsync``, ``no-journal-fsync``): the crash states are then exactly those
of a library without that durability step, while the code that runs stays the
real one. Each mutant must produce a counterexample. A *site* mutant
(:data:`SITE_MUTANTS`) removes only the fsyncs of one kind asked for by one
function of the pack, merge and gc paths (``no-fsync@packing.drop_from_packs:file``):
each of those fsyncs must matter to some workload.

Crashing twice (``depth=2``): a workload with a ``rerun`` (the interrupted operation
run again by a new process, gc after a killed gc, say) is also recorded inside crash
states of its first recording; every crash state of that second recording is checked
against the promises of the first. Under a budget :data:`SECOND_CRASHES` first crash
states are taken (drawn at random, distinct crash points first), each with
:data:`SECOND_MAX_STATES` second states.

With a budget (``max_states``) the states are taken in this order, identical
trees merged (trees that differ only inside unpublished ``.tmp-*`` entries count
as one): at every call the state that loses everything unsynced, then the one
that keeps everything, then those that lose or keep one thing at a time, then
states drawn at random (seeded). Without a budget, every distinct tree of every
call (at most :data:`FULL_CAP` states per call, drawn at random beyond that).
"""

from __future__ import annotations

import dataclasses
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
from afk_local.storage.meta_index import DELETED_NAME, INDEX_NAME
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
from afk_local.testing.crashsim.mutants import MUTANTS, SITE_MUTANTS
from afk_local.testing.crashsim.registry import WORKLOADS
from afk_local.testing.crashsim.trace import (
    Ack,
    CheckpointAck,
    GoneAck,
    KeptAck,
    MetaAck,
    MetricsAck,
    OutcomeAck,
    Recorder,
    RecordingError,
    RemovedAck,
    Session,
    StatusAck,
    Trace,
)
from afk_local.testing.crashsim.workloads import Workload

SECOND_CRASHES = 6
"""With a budget: first crash states in which the rerun is recorded and crashed again."""

SECOND_MAX_STATES = 20
"""With a budget: second crash states checked per first crash state."""

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
    first_crash: tuple[str, ...] = ()
    """Crashing twice: the first crash (its call and what it lost); ``call``, ``op`` and
    ``lost`` then describe the second, in the recording of the rerun."""


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
    second_states: int = 0
    """Crashing twice: second crash states checked (summed over the first states taken)."""
    first_states_rerun: int = 0
    """Crashing twice: first crash states in which the rerun was recorded."""

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
    return initial, _recorded(
        workload, workload.record, base=base, initial=initial, prepared=prepared
    )


def _recorded(
    workload: Workload,
    part: Any,
    *,
    base: Path,
    initial: Tree,
    prepared: Any,
    inherited: tuple[Ack, ...] = (),
) -> Trace:
    """Run ``part(session, prepared)`` on the store in ``base`` (whose tree is ``initial``),
    recorded; check the model replayed from the trace matches the disk."""
    store = workload.store(base / "store")
    recorder = Recorder(base)
    session = Session(base, store, recorder, acks=list(inherited))
    previous_probe = use_probe(session)
    previous = fsio.set_io_recorder(recorder)
    try:
        part(session, prepared)
    finally:
        fsio.set_io_recorder(previous)
        use_probe(previous_probe)
    trace = Trace(tuple(recorder.ops), tuple(session.acks), tuple(session.calls))
    model = DiskModel(initial)
    for op in trace.ops:
        model.apply(op)
    trash = fsio.TEMP_PREFIX + "deleted-"  # removed by rmtree once unpublished: not durable I/O
    expected = {p: n for p, n in model.tree().items() if trash not in p}
    # owner.lock is made by filelock; runs.index is a cache and runs.deleted a hint to it,
    # never fsynced (meta_index)
    ignored = ("owner.lock", INDEX_NAME, DELETED_NAME)
    # *.lock: the file locks of schedules and shared limits, made by filelock (no data)
    differences = tree_differences(
        expected, read_tree(base), ignore=ignored, ignore_suffixes=(".lock",)
    )
    if differences:
        raise RecordingError(
            f"workload {workload.name}: the disk differs from the recorded calls (a write that "
            f"bypassed afk_local.storage.fsio?): {'; '.join(differences[:5])}"
        )
    return trace


def _rebased(acks: tuple[Ack, ...]) -> tuple[Ack, ...]:
    """Promises of a first recording, binding from the start of a second one."""
    out: list[Ack] = []
    for a in acks:
        if isinstance(a, CheckpointAck):
            if a.until is None:  # one the interrupted operation was releasing: released
                out.append(CheckpointAck(0, a.run_id, a.seq, a.payload))
        elif isinstance(a, OutcomeAck):
            out.append(OutcomeAck(0, a.run_id, a.key, a.status, a.result))
        elif isinstance(a, StatusAck):
            out.append(StatusAck(0, a.run_id, a.status))
        elif isinstance(a, KeptAck):
            if a.until is None:
                out.append(KeptAck(0, a.path, a.sha256))
        elif isinstance(a, RemovedAck):
            out.append(RemovedAck(0, a.run_id))
        elif isinstance(a, (MetaAck, GoneAck, MetricsAck)):
            out.append(dataclasses.replace(a, at=0))
        # a DoneAck does not carry over: the rerun rewrites the run again
    return tuple(out)


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
    depth: int = 1,
    second_crashes: int | None = SECOND_CRASHES,
) -> Exploration:
    """Explore the crash states of one workload; stop at the first that does not recover.

    Args:
        workload: a name from :data:`~afk_local.testing.crashsim.WORKLOADS`, or a Workload.
        mutant: a name from :data:`MUTANTS` or :data:`SITE_MUTANTS`, or None for the
            library as it is.
        max_states: distinct crash states to check at most; None checks them all (and,
            crashing twice, every second state of every first state taken).
        seed: seeds the random part of the choice of states.
        depth: 2 also crashes the workload's ``rerun`` inside first crash states.
        second_crashes: crashing twice: first crash states to rerun in (None: all the
            first states checked).

    Example:
        >>> explore("sync", max_states=20).ok  # doctest: +SKIP
        True
    """
    chosen = WORKLOADS[workload] if isinstance(workload, str) else workload
    kinds: frozenset[str] = frozenset()
    sites: frozenset[tuple[str, str]] = frozenset()
    if mutant in MUTANTS:
        kinds = frozenset({MUTANTS[mutant]})
    elif mutant in SITE_MUTANTS:
        sites = frozenset({SITE_MUTANTS[mutant]})
    elif mutant is not None:
        raise ValueError(
            f"unknown mutant {mutant!r}: choose one of {', '.join([*MUTANTS, *SITE_MUTANTS])}"
        )
    if depth not in (1, 2):
        raise ValueError("depth must be 1 or 2")
    started = time.perf_counter()
    rng = random.Random(f"{seed}:{chosen.name}")
    with tempfile.TemporaryDirectory(
        prefix=f"afk-crashsim-{chosen.name}-", dir=scratch_root()
    ) as tmp:
        work = Path(tmp)
        (work / "base").mkdir()
        (work / "scratch").mkdir()
        store = chosen.store(work / "base" / "store")
        prepared = chosen.setup(store, work / "scratch")
        initial = read_tree(work / "base")
        trace = _recorded(
            chosen, chosen.record, base=work / "base", initial=initial, prepared=prepared
        )
        model = DiskModel(initial, ignored_fsyncs=kinds, ignored_sites=sites)
        frontiers = _frontiers(model, trace)
        removed = len(model.ignored)
        taken: list[tuple[Frontier, Choice]] = []
        states, found = 0, None
        if mutant is None or removed:  # a mutant that removes nothing changes nothing
            states, found = _explore_frontiers(
                frontiers,
                trace,
                workload=chosen,
                work=work,
                max_states=max_states,
                rng=rng,
                mutant=mutant,
                model=model,
                taken=taken,
            )
        second, reruns = 0, 0
        if found is None and depth == 2 and chosen.rerun is not None:
            second, reruns, found = _crash_again(
                chosen,
                work,
                prepared=prepared,
                trace=trace,
                taken=taken,
                max_states=max_states,
                second_crashes=second_crashes,
                rng=rng,
                mutant=mutant,
                kinds=kinds,
                sites=sites,
            )
    return Exploration(
        workload=chosen.name,
        mutant=mutant,
        seed=seed,
        max_states=max_states,
        calls=len(trace.ops),
        crash_points=len(frontiers),
        combinations=sum(f.combinations for f in frontiers),
        states=states,
        removed=removed,
        seconds=round(time.perf_counter() - started, 3),
        counterexample=found,
        second_states=second,
        first_states_rerun=reruns,
    )


def _frontiers(model: DiskModel, trace: Trace) -> list[Frontier]:
    frontiers = [model.frontier(0)]
    for op in trace.ops:
        model.apply(op)
        frontiers.append(model.frontier(op.index, op))
    return frontiers


def _explore_frontiers(
    frontiers: list[Frontier],
    trace: Trace,
    *,
    workload: Workload,
    work: Path,
    max_states: int | None,
    rng: random.Random,
    mutant: str | None,
    model: DiskModel,
    taken: list[tuple[Frontier, Choice]] | None = None,
    first_crash: tuple[str, ...] = (),
) -> tuple[int, Counterexample | None]:
    """Check the crash states of ``frontiers``; returns (states checked, counterexample).

    ``taken`` collects every distinct state checked (the candidates for crashing twice).
    """
    promised = [(trace.acks_at(f.at), trace.calls_at(f.at)) for f in frontiers]
    seen: set[tuple[str, int, int]] = set()
    states = 0
    for frontier, choice in _candidates(frontiers, max_states, rng):
        acks, calls = promised[frontier.at]
        tree = frontier.tree(choice)
        digest = tree_digest(tree, temporaries_by_name=max_states is not None)
        key = (digest, len(acks), len(calls))
        if key in seen:
            continue
        seen.add(key)
        states += 1
        if taken is not None:
            taken.append((frontier, choice))
        problems = _check(tree, work / "state", workload, acks, calls)
        if problems:
            return states, Counterexample(
                workload=workload.name,
                mutant=mutant,
                call=frontier.at,
                op=frontier.op.describe() if frontier.op else "#0 (before the first)",
                lost=tuple(frontier.lost(choice)),
                problems=tuple(problems),
                ignored=tuple(op.describe() for op in model.ignored if op.index <= frontier.at),
                first_crash=first_crash,
            )
        if max_states is not None and states >= max_states:
            break
    return states, None


def _crash_again(
    workload: Workload,
    work: Path,
    *,
    prepared: Any,
    trace: Trace,
    taken: list[tuple[Frontier, Choice]],
    max_states: int | None,
    second_crashes: int | None,
    rng: random.Random,
    mutant: str | None,
    kinds: frozenset[str],
    sites: frozenset[tuple[str, str]],
) -> tuple[int, int, Counterexample | None]:
    """Record the workload's rerun inside first crash states and check every second one.

    Returns (second states checked, first states rerun in, counterexample).
    """
    rerun = workload.rerun
    assert rerun is not None
    firsts = _spread(taken, second_crashes if max_states is not None else None, rng)
    budget = SECOND_MAX_STATES if max_states is not None else None
    total = 0
    for count, (frontier, choice) in enumerate(firsts, start=1):
        first_tree = frontier.tree(choice)
        first = (
            f"first crash right after call "
            f"{frontier.op.describe() if frontier.op else '#0 (before the first)'}",
            *(f"  it {line}" for line in frontier.lost(choice)),
        )
        base = work / "again"
        shutil.rmtree(base, ignore_errors=True)
        write_tree(first_tree, base)
        workload.store(base / "store")  # a keyed store takes the recorded head records
        first_tree = read_tree(base)  # as filed under this store's path
        acks = _rebased(trace.acks_at(frontier.at))
        calls = trace.calls_at(frontier.at)
        try:
            second = _recorded(
                workload, rerun, base=base, initial=first_tree, prepared=prepared, inherited=acks
            )
        except RecordingError:
            raise
        except Exception as exc:  # the rerun itself failed in the crash state: a finding
            return (
                total,
                count,
                Counterexample(
                    workload=workload.name,
                    mutant=mutant,
                    call=0,
                    op="#0 (the rerun, before any crash)",
                    lost=(),
                    problems=(f"re-running the operation raised {type(exc).__name__}: {exc}",),
                    first_crash=first,
                ),
            )
        second = Trace(second.ops, second.acks, calls + second.calls)
        model = DiskModel(first_tree, ignored_fsyncs=kinds, ignored_sites=sites)
        frontiers = _frontiers(model, second)
        states, found = _explore_frontiers(
            frontiers,
            second,
            workload=workload,
            work=work,
            max_states=budget,
            rng=rng,
            mutant=mutant,
            model=model,
            first_crash=first,
        )
        total += states
        if found is not None:
            return total, count, found
    return total, len(firsts), None


def _spread(
    taken: list[tuple[Frontier, Choice]], limit: int | None, rng: random.Random
) -> list[tuple[Frontier, Choice]]:
    """Up to ``limit`` first states, one per crash point first (in random order), then any."""
    if limit is None or len(taken) <= limit:
        return list(taken)
    by_point: dict[int, list[tuple[Frontier, Choice]]] = {}
    for item in taken:
        by_point.setdefault(item[0].at, []).append(item)
    points = list(by_point)
    rng.shuffle(points)
    chosen = [rng.choice(by_point[p]) for p in points[:limit]]
    return chosen


SCRATCH_MIN_FREE_BYTES = 1 << 30
"""A memory-backed temp directory is used only with this much free (a container's
/dev/shm is often 64 MiB: the explorer would run out of space there, not find a bug)."""


def scratch_root() -> str | None:
    """A memory-backed temp directory when there is one with room: crash states are
    built and resumed by the thousand, and a disk's fsyncs and unlinks would dominate
    the run (what is checked is what a new process makes of the files, not the disk).
    None: the system's temp directory."""
    shm = "/dev/shm"  # noqa: S108 - a private directory is made inside it
    if not (os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK)):
        return None
    try:
        free = os.statvfs(shm)
    except OSError:
        return None
    return shm if free.f_bavail * free.f_frsize >= SCRATCH_MIN_FREE_BYTES else None


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
    "SECOND_CRASHES",
    "SECOND_MAX_STATES",
    "SITE_MUTANTS",
    "Counterexample",
    "Exploration",
    "explore",
    "record",
    "scratch_root",
]
