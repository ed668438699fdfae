"""Run one program against a real store and hold it to the reference model.

:func:`run_program` plays a :class:`~.program.Program` in a fresh directory: every
segment's actions through the public API (``job.run``, ``afk.resume`` with answers,
``afk.settle`` for effects left in doubt, ``Store.gc``/``pack``/``fork``/``delete``,
export and import, ``verify``), its faults (SIGKILLed children, power cuts built by the
crash explorer's disk model), then a liveness phase without faults (every run is
driven until it completes), then the final checks. It returns the divergences from
the model, as sentences; an empty list means the program passed.

What the model holds the store to:

- a run's result is :func:`~.program.expected_result` of its instructions, in every
  process that gets it, and for forks and imports of it too;
- a side effect that is not idempotent runs at most once per idempotency key (a crash
  between its intent and outcome is reported in doubt, and settled from the ledger as a
  careful person would); every effect of every run that completed ran at least once;
- after a power cut, everything acknowledged before it is there: a run whose attempt
  returned ``completed`` reads completed with its result; a removed run stays removed; a
  fork or an import that returned exists; no run exists that was never made;
- listings (``store.runs``, ``store.interrupted``) and ``verify`` agree with the model;
- liveness: once faults stop, every run finishes within a bounded number of attempts.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from afk_local.agent.resume import resume
from afk_local.clock import using_clock, wall_ns
from afk_local.errors import (
    EffectInDoubtError,
    RunLockedError,
    RunPaused,
    RunSleeping,
)
from afk_local.runner.operations.settle import settle
from afk_local.storage.format.records import RunStatus
from afk_local.storage.ops.retention import RetentionPolicy
from afk_local.storage.store import Store
from afk_local.testing import run_and_kill
from afk_local.testing.crashsim.disk import read_tree
from afk_local.testing.crashsim.mutants import MUTANTS
from afk_local.testing.fuzz.command import afk_local_command, child_environ
from afk_local.testing.fuzz.concurrent import Maintainer, watch_once, watch_problems
from afk_local.testing.fuzz.jobs import JOBS, answer_for, read_ledger
from afk_local.testing.fuzz.model import RunModel, acknowledged_problems, final_problems
from afk_local.testing.fuzz.power import cut_power, recording
from afk_local.testing.fuzz.program import (
    Action,
    Program,
    Segment,
    expected_result,
)
from afk_local.testing.fuzz.store_actions import Pending, StoreActions

logger = logging.getLogger("afk_local")

FUZZ_KEY = "afk-fuzz-store-key-0123456789abcdef"
"""The key of a keyed program's store (a test key: the store lives for one program)."""

LIVENESS_ATTEMPTS = 40
"""Attempts the liveness phase gives one run before it reports that it never finished."""


@dataclass
class Execution(StoreActions):
    """One program being played (see the module docstring)."""

    program: Program
    work: Path
    mutant: str | None = None
    """A crash explorer kind mutant (``no-journal-fsync``...): power cuts lose what that
    kind of fsync would have kept, as in a library without it; the fuzzer must notice."""
    problems: list[str] = field(default_factory=list)
    runs: dict[str, RunModel] = field(default_factory=dict)
    removed: set[str] = field(default_factory=set)
    gone: set[str] = field(default_factory=set)
    """Runs removed by an action, acknowledged or not: no later attempt makes them again."""
    counter: int = 0
    _recording: bool = False
    """A power-cut segment is being recorded (no child may write meanwhile)."""
    watched: list[str] = field(default_factory=list)
    """Runs a ``watch`` action's children finished."""

    def __post_init__(self) -> None:
        self.base = self.work / "disk"
        self.base.mkdir()
        self.root = self.base / "store"
        self.ledger = str(self.work / "ledger")
        # beside the store on the recorded disk: head records are written unsynced and
        # recorded, so a power cut leaves of them what the crash state holds
        self.heads = self.base / "heads"
        self.clock = SteppedClock()
        self.store = self._open_store()
        for spec in self.program.runs:
            self.runs[spec.run_id] = RunModel(spec, "job", expected_result(spec.instructions))

    def _open_store(self) -> Store:
        """The program's store as a new process opens it."""
        if not self.program.keyed:
            return Store(self.root)
        return Store(self.root, key=FUZZ_KEY, head_dir=self.heads)

    def _child_env(self) -> contextlib.AbstractContextManager[None]:
        """The environment child processes open the store with (a keyed store's key)."""
        if not self.program.keyed:
            return contextlib.nullcontext()
        return child_environ({"AFK_LOCAL_KEY": FUZZ_KEY, "AFK_LOCAL_HEAD_DIR": str(self.heads)})

    # -- the program ------------------------------------------------------------

    def play(self) -> list[str]:
        """Every segment, the liveness phase, the final checks; returns the divergences."""
        with using_clock(self.clock):
            return self._play()

    def _play(self) -> list[str]:
        for number, segment in enumerate(self.program.segments):
            if segment.fault == "cut":
                self._cut_segment(number, segment)
            else:
                for action in segment.actions:
                    self._act(action, in_child=segment.fault == "kill").commit()
            if self.problems:
                return self.problems
        self._liveness()
        if not self.problems:
            self._final_checks()
        return self.problems

    def _diverge(self, text: str) -> None:
        self.problems.append(text)

    def _act(self, action: Action, *, in_child: bool = False) -> Pending:
        spec = self.program.runs[action.run]
        run_id = spec.run_id
        self.counter += 1
        if action.kind == "attempt":
            return self._attempt(run_id, kill_at=action.kill_at if in_child else None)
        if action.kind == "busy":
            return self._busy(action, run_id, kill_at=action.kill_at if in_child else None)
        if action.kind == "clock":
            if action.arg % 3 == 0:
                self.clock.offset -= 3.0  # NTP or a person steps the clock back
            else:  # ... or it steps while the next attempt runs, back or forward
                self.clock.step_after(1 + action.arg % 25, -3.0 if action.arg % 3 == 1 else 3.0)
            return Pending()
        if action.kind == "watch":
            return self._watch(in_child=in_child)
        if in_child:
            return self._command(action, self._source(run_id))
        if action.kind == "gc":
            effects = (None, None, 1, 3)[action.arg % 4]
            policy = RetentionPolicy(
                keep_runtime_states=action.arg % 3, max_effects_per_run=effects
            )
            self.store.gc(policy)
        elif action.kind == "pack":
            self.store.pack()
        elif action.kind == "verify":
            self._verify_completed()
        elif action.kind == "fork":
            return self._fork(self._source(run_id), action.arg)
        elif action.kind == "export":
            return self._export(self._source(run_id))
        elif action.kind == "rm":
            return self._remove(run_id)
        return Pending()

    def _command(self, action: Action, run_id: str) -> Pending:
        """A store operation as ``afk-local`` in a child, SIGKILLed at a random I/O call."""
        kill_at = random.Random(f"{self.program.seed}:{self.counter}").randint(1, 20)
        if not self.root.is_dir():  # every attempt so far was killed before the store was
            return Pending()  # made: afk-local refuses a root that is not a store (exit 2)
        completed = run_id in self.runs and self._completed_on_disk(run_id)
        new_id = f"{run_id}-{action.kind[0]}{self.counter}"
        pending = Pending()
        if action.kind == "gc":
            args = ["gc", "--keep-runtime-states", str(1 + action.arg % 3)]
            args += ["--max-effects-per-run", "1"] if action.arg % 4 == 2 else []
        elif action.kind == "pack":
            args = ["pack"]
        elif action.kind == "verify" and completed:
            args = ["verify", run_id]
        elif action.kind == "rm" and completed:
            args, pending = ["rm", run_id], self._removal(run_id)
        elif action.kind == "fork" and completed:
            history = self.store.open(run_id).history()
            seq = history[action.arg % len(history)].seq
            args = ["fork", run_id, "--at", str(seq), "--as", new_id]
            pending = self._made(new_id, self.runs[run_id], "fork")
        elif action.kind == "export" and completed:
            exported = self.work / f"{new_id}.json"
            with self._child_env():
                export = afk_local_command(
                    self.root, ["export", run_id, "-o", str(exported)], kill_at=None
                )
            if export.returncode != 0:
                self._diverge(
                    f"afk-local export {run_id}: exit {export.returncode}: {export.stderr[-500:]}"
                )
                return Pending()
            args = ["import", str(exported), "--as", new_id]
            pending = self._made(new_id, self.runs[run_id], "import")
        else:
            return Pending()
        if action.kind == "rm":
            self.gone.add(run_id)
        with self._child_env():
            done = afk_local_command(self.root, args, kill_at=kill_at)
        if done.killed:
            pending.in_flight()
            return Pending()
        refused = "gc trimmed its effect journal" in done.stderr  # fork: documented refusal
        if done.returncode != 0 and not refused:
            self._diverge(
                f"afk-local {' '.join(args)}: exit {done.returncode}: {done.stderr[-500:]}"
            )
        return Pending() if refused else pending

    def _source(self, run_id: str) -> str:
        """A run of the model to fork or export: ``run_id`` or the newest run made from it."""
        made = [r for r, m in self.runs.items() if r.startswith(run_id) and m.kind != "import"]
        return made[-1] if made else run_id

    # -- attempts ---------------------------------------------------------------

    def _attempt(self, run_id: str, *, kill_at: int | None) -> Pending:
        model = self.runs.get(run_id)
        if model is None or model.kind == "import" or run_id in self.gone:
            return Pending()
        job = JOBS[model.spec.mode]
        meta = self.store.read_meta(run_id) if self.store.exists(run_id) else None
        if kill_at is not None and (meta is None or meta.status is not RunStatus.PAUSED):
            with self._child_env():
                killed = run_and_kill(
                    job,
                    model.spec.program(),
                    self.ledger,
                    at=kill_at,
                    store=self.store,
                    run_id=run_id,
                )
            if killed.killed:
                return Pending()
            if killed.returncode not in (0, 3, 4, 1):
                self._diverge(
                    f"run {run_id}: the child exited {killed.returncode}: {killed.stderr[-800:]}"
                )
            return self._acknowledged(run_id, completed=killed.completed, result=None)
        try:
            if meta is None:
                result = job.with_store(self.store).run(
                    model.spec.program(), self.ledger, run_id=run_id
                )
            elif meta.status is RunStatus.PAUSED and meta.pause is not None:
                result = resume(
                    run_id,
                    store=self.store,
                    input=answer_for(str(meta.pause.prompt)),
                    pause_seq=meta.pause.seq,
                )
            else:
                if meta.status is RunStatus.SLEEPING and meta.wake_at_ms:
                    time.sleep(max(0.0, meta.wake_at_ms / 1000 - self.clock.time()) + 0.001)
                result = resume(run_id, store=self.store)
        except (RunPaused, RunSleeping):
            return self._acknowledged(run_id, completed=False, result=None)
        except EffectInDoubtError as exc:
            self._settle(run_id, exc)
            return self._acknowledged(run_id, completed=False, result=None)
        except ValueError as exc:
            if "fails the first time" not in str(exc):
                raise
            return self._acknowledged(run_id, completed=False, result=None)
        if result != model.expected:
            self._diverge(f"run {run_id}: returned {result!r}, the model says {model.expected!r}")
        return self._acknowledged(run_id, completed=True, result=result)

    def _busy(self, action: Action, run_id: str, *, kill_at: int | None) -> Pending:
        """An attempt with gc and verify of the whole store running beside it."""
        effects = (None, 1)[action.arg % 2]
        policy = RetentionPolicy(keep_runtime_states=action.arg % 3, max_effects_per_run=effects)
        with Maintainer(self._open_store, policy) as maintainer:
            try:
                pending = self._attempt(run_id, kill_at=kill_at)
            except RunLockedError:  # gc holds the run's lock for a moment: nothing ran
                pending = None
        self.problems += maintainer.problems
        if pending is None:  # "wait for that process to finish, then try again"
            pending = self._attempt(run_id, kill_at=kill_at)
        return pending

    def _watch(self, *, in_child: bool) -> Pending:
        """``afk-local watch --once``: the watcher resumes every interrupted run. Only
        where no power cut is recorded (its children's I/O is theirs, not this process's)."""
        if self._recording or not self.root.is_dir():
            return Pending()  # no store yet: watch --once refuses a root that is not one
        with self._child_env():
            done = watch_once(self.root)
        unexpected = watch_problems(done)
        if unexpected:
            self._diverge(f"afk-local watch --once: exit {done.returncode}: {unexpected}")
        before = set(self.watched) | {r for r, m in self.runs.items() if m.completed}
        finished = [r for r in self.runs if r not in self.gone and self._completed_on_disk(r)]
        self.watched += [r for r in finished if r not in before]

        def commit() -> None:  # what its children finished, they acknowledged by exiting
            for run_id in finished:
                if run_id in self.runs:
                    self.runs[run_id].exists = self.runs[run_id].completed = True

        return Pending(commit)

    def _acknowledged(self, run_id: str, *, completed: bool, result: Any) -> Pending:
        model = self.runs[run_id]

        def commit() -> None:
            model.exists = True
            model.completed = model.completed or completed

        return Pending(commit)

    def _settle(self, run_id: str, exc: EffectInDoubtError) -> None:
        """Decide an effect in doubt as a careful person would: look at the world."""
        ran = [
            e
            for e in read_ledger(self.ledger)
            if e["key"] == exc.idempotency_key and e["status"] == "ok"
        ]
        if ran:
            settle(run_id, exc.key, store=self.store, done=True, result=ran[0]["value"])
        else:
            settle(run_id, exc.key, store=self.store, done=False, message="never ran (ledger)")

    # -- store operations --------------------------------------------------------

    def _verify_completed(self) -> None:
        for run_id in list(self.runs):
            if self._completed_on_disk(run_id):
                report = self.store.open(run_id, lazy=True).verify()
                if not report.ok:
                    self._diverge(f"run {run_id}: verify of a completed run: {report.problems}")

    # -- power cuts --------------------------------------------------------------

    def _cut_segment(self, number: int, segment: Segment) -> None:
        """Record the segment's I/O, then build the disk a power cut at a random point of
        it leaves (crash explorer model) and go on from there as a new process."""
        rng = random.Random(f"{self.program.seed}:cut{number}")
        initial = read_tree(self.base)
        done: list[tuple[int, int, Pending]] = []
        self._recording = True
        try:
            with recording(self.base) as recorder:
                for action in segment.actions:
                    start = len(recorder)
                    pending = self._act(action)
                    done.append((start, len(recorder), pending))
                    if self.problems:
                        return
        finally:
            self._recording = False
        ops = recorder.ops
        at = cut_power(self.base, initial, ops, rng, self.mutant)
        _keep_ledger_until(self.ledger, at)
        self.store = self._open_store()  # a new process after the power cut
        for start, end, pending in done:
            if end <= at:
                pending.commit()
            elif start < at:
                pending.in_flight()
            else:
                pending.undone()
        where = (
            f"power cut after call {at} of {len(ops)} ({ops[at - 1].describe() if at else 'none'})"
        )
        self._check_acknowledged(where)

    def _check_acknowledged(self, where: str) -> None:
        self.problems += acknowledged_problems(self.store, self.runs, self.removed, where)

    # -- after the faults ------------------------------------------------------------

    def _liveness(self) -> None:
        for run_id, model in list(self.runs.items()):
            if model.kind == "import":
                continue
            for _ in range(LIVENESS_ATTEMPTS):
                if self.problems:
                    return
                if self._completed_on_disk(run_id):
                    break
                self._attempt(run_id, kill_at=None).commit()
            else:
                meta = self.store.read_meta(run_id) if self.store.exists(run_id) else None
                self._diverge(
                    f"liveness: run {run_id} did not finish in {LIVENESS_ATTEMPTS} attempts "
                    f"(status {meta.status if meta else 'missing'})"
                )

    def _final_checks(self) -> None:
        self.problems += final_problems(self.store, self.runs, self.ledger)


def _keep_ledger_until(ledger: str, at: int) -> None:
    """Effects made after the cut point never happened in the world of the cut."""
    kept = [{**e, "pos": None} for e in read_ledger(ledger) if e["pos"] is None or e["pos"] <= at]
    text = "".join(json.dumps(e) + "\n" for e in kept)
    Path(ledger).write_text(text, encoding="utf-8")


class SteppedClock:
    """The wall clock plus an offset that ``clock`` actions step, at once or after some
    more readings (in the middle of an attempt)."""

    def __init__(self) -> None:
        self.offset = 0.0
        self._armed: tuple[int, float] | None = None
        self._lock = threading.Lock()

    def step_after(self, readings: int, by: float) -> None:
        """Step the clock by ``by`` seconds once it was read ``readings`` more times."""
        with self._lock:
            self._armed = (readings, by)

    def time(self) -> float:
        """Now, stepped."""
        with self._lock:
            if self._armed is not None:
                left, by = self._armed
                if left <= 1:
                    self.offset += by
                    self._armed = None
                else:
                    self._armed = (left - 1, by)
            return wall_ns() / 1e9 + self.offset

    def sleep(self, seconds: float) -> None:
        """Really wait (the fuzzer's sleeps are milliseconds)."""
        time.sleep(max(0.0, seconds))


def run_program(
    program: Program, *, mutant: str | None = None, scratch: str | None = None
) -> list[str]:
    """Play ``program`` in a fresh temporary directory; returns its divergences (none: []).

    Args:
        mutant: a kind mutant of the crash explorer (:data:`~.crashsim.MUTANTS`) for the
            power cuts, to show the fuzzer notices a library without that fsync.
        scratch: where the temporary directory goes (default: memory-backed if any).
    """
    if mutant is not None and mutant not in MUTANTS:
        raise ValueError(f"unknown mutant {mutant!r}: choose one of {', '.join(MUTANTS)}")
    work = Path(_tempdir(scratch))
    try:
        try:
            return Execution(program, work, mutant).play()
        except Exception as exc:  # anything the public API raised that the model did not expect
            logger.debug("fuzz program %s raised", program.seed, exc_info=True)
            return [f"raised {type(exc).__name__}: {exc}"]
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _tempdir(scratch: str | None) -> str:
    import tempfile  # noqa: PLC0415

    from afk_local.testing.crashsim.explorer import scratch_root  # noqa: PLC0415

    return tempfile.mkdtemp(prefix="afk-fuzz-", dir=scratch or scratch_root())


__all__ = ["FUZZ_KEY", "LIVENESS_ATTEMPTS", "Execution", "run_program"]
