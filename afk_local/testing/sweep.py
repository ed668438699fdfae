"""The kill sweep: a job killed at every durable I/O call, resumed, compared (docs/testing.md).

:func:`kill_sweep` runs a job once to its end in a child process, counting its durable
I/O calls through the I/O seam's hook (:func:`afk_local.testing.kill_at_io_call`), then
for each call ``k`` starts the same job in a fresh store, SIGKILLs it at call ``k`` and
resumes it the way a user would: ``afk-local resume RUN``, ``afk-local watch --once`` or
the same call again, in turn. Each trial's ending is compared with the uninterrupted
run's: the same status and result, and every line of the effect log (:func:`record_effect`)
written as often; a run that ends reporting an effect in doubt (with the ``afk-local
settle`` command) is a right ending when no effect ran twice.
"""

from __future__ import annotations

import collections
import importlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from afk_local.clock import CLOCK_ENV, Clock, ScaledClock, SystemClock
from afk_local.storage.format.records import RunMeta, RunStatus
from afk_local.storage.store import Store
from afk_local.testing.forkserver import run_python
from afk_local.testing.kills import EXIT_PAUSED, EXIT_SLEEPING, kill_at_io_call

SWEEP_LOG_ENV = "AFK_SWEEP_LOG"
"""The environment variable naming the effect log of the current sweep trial."""

RESUMES = ("resume", "watch", "call")
"""How a killed run is resumed, in turn: ``afk-local resume RUN``, ``afk-local watch
--once``, or the same call again with the run's id."""

_CHILD = "import sys; from afk_local.testing.sweep import _child_main; _child_main(sys.argv[1])"
_KILLED_MARK = "afk-testing: killing at "
_PARKED_ROUNDS = 50  # resumes of a run that parks again before it is called a hang


def record_effect(line: str) -> None:
    """Append ``line`` to the sweep's effect log; does nothing outside a :func:`kill_sweep`.

    Call it where your job does something that must happen once (a charge, an email, a
    question to a model): the sweep checks each line is written as often as in the
    uninterrupted run, so a repeated effect shows up as a wrong ending.

    Example:
        >>> record_effect("charged order 42")  # no sweep running: nothing happens
    """
    path = os.environ.get(SWEEP_LOG_ENV)
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line.replace("\n", " ") + "\n").encode())
    finally:
        os.close(fd)


@dataclass(frozen=True)
class SweepTrial:
    """One kill of a :func:`kill_sweep` and how its resumed run ended."""

    point: int
    """The durable I/O call (1-based) at which the first child was killed."""
    then: int | None
    """For a pair: the call of the resume at which it was killed too; else None."""
    resume: str
    """How the run was resumed after the kill(s): one of :data:`RESUMES`."""
    killed: bool
    """False when the job finished before reaching ``point``."""
    ending: str
    """``"same"``, ``"in doubt"`` (reported, no effect repeated) or what went wrong."""
    where: str = ""
    """The call killed, as the kill switch named it (``fsync #12 (.../effects.log)``)."""

    @property
    def wrong(self) -> bool:
        """True when the ending differs from the uninterrupted run's (a bug)."""
        return self.ending not in ("same", "in doubt")


@dataclass(frozen=True)
class SweepResult:
    """What :func:`kill_sweep` found: the uninterrupted run and every trial."""

    job: str
    calls: int
    """Durable I/O calls of the uninterrupted run (the kill points there are)."""
    status: str
    result: Any
    """The uninterrupted run's result (as stored)."""
    effects: tuple[str, ...]
    """The effect log lines of the uninterrupted run."""
    trials: tuple[SweepTrial, ...]
    workdir: str

    @property
    def wrong(self) -> list[SweepTrial]:
        """The trials that ended differently from the uninterrupted run."""
        return [t for t in self.trials if t.wrong]

    @property
    def ok(self) -> bool:
        """True when no trial ended wrong."""
        return not self.wrong

    def check(self) -> SweepResult:
        """Raise AssertionError listing every wrong ending (replay one with ``points=[k]``)."""
        if self.wrong:
            lines = [
                f"kill at call {t.point}"
                + (f" then {t.then}" if t.then else "")
                + f" [{t.where or 'not reached'}], resumed by {t.resume}: {t.ending}"
                for t in self.wrong
            ]
            raise AssertionError(
                f"kill sweep of {self.job}: {len(self.wrong)} of {len(self.trials)} trials "
                f"ended wrong (stores under {self.workdir}; rerun one with points=[K]):\n  "
                + "\n  ".join(lines)
            )
        return self


def kill_sweep(
    job: Any,
    *args: Any,
    points: Iterable[int] | None = None,
    sample: int | None = None,
    seed: str | int | None = None,
    resumes: Sequence[str] = RESUMES,
    pairs: bool = False,
    timeout: float = 60.0,
    env: Mapping[str, str] | None = None,
    workdir: str | os.PathLike[str] | None = None,
    run_id: str = "swept",
    compare: Callable[[Any], Any] | None = None,
    **kwargs: Any,
) -> SweepResult:
    """Kill ``job(*args, **kwargs)`` at each durable I/O call, resume it, compare the ending.

    Args:
        job: an ``@afk.durable`` function, or ``"module:function"`` naming a module-level
            callable taking ``run_id=`` (a standalone agent run, say). The child
            processes import it, so it must live in an importable module.
        points: the kill points (1-based durable I/O calls) to try; default all of them,
            or ``sample`` of them.
        sample: try this many points, drawn with ``seed``; the first and the last are
            always among them. None: every point.
        seed: what draws the sample (printed in failures, so a run can be repeated).
        resumes: the resume methods used in turn (:data:`RESUMES`).
        pairs: also kill each resume once, at a point drawn in the resume's own calls,
            before resuming again (a crash during recovery).
        timeout: seconds any child (a run, a resume) may take; past it the trial ends
            as a hang.
        env: extra environment for the children (``ScaledClock(...).env()``).
        workdir: where each trial's store and effect log go (default: a new temp dir).
        run_id: the run id each trial uses (the one the swept code runs under, when it
            picks its own, e.g. a ``StateCheckpoint``'s ``"state"``).
        compare: applied to each stored result before they are compared: keep what must
            not depend on crashes (an agent run's ``replayed_effect_count`` does).
        **kwargs: the job's keyword arguments.

    Returns:
        A :class:`SweepResult`; ``result.check()`` raises on any wrong ending.

    Example:
        >>> kill_sweep(charge_order, 42, sample=8).check()  # doctest: +SKIP
    """
    target = _entrypoint(job)
    unknown = [r for r in resumes if r not in RESUMES]
    if not resumes or unknown:
        raise ValueError(f"resumes must be among {', '.join(RESUMES)}, not {unknown or resumes}")
    base = Path(workdir if workdir is not None else tempfile.mkdtemp(prefix="afk-sweep-"))
    sweep = _Sweep(target, args, kwargs, base, timeout, dict(env or {}), run_id, compare)

    expected = sweep.trial("uninterrupted")
    first = sweep.start(expected, at=None)
    if first.hung:
        raise AssertionError(f"kill sweep of {target}: the uninterrupted run hung ({timeout} s)")
    calls = first.calls
    problem = sweep.finish(expected, "call")
    if problem:
        raise AssertionError(
            f"kill sweep of {target}: the uninterrupted run did not end: {problem}"
        )
    status, result = sweep.ending(expected)
    if status == "missing":
        raise AssertionError(
            f"kill sweep of {target}: the uninterrupted run left no run {run_id!r} in its store "
            f"(does it run under the run_id it is given?); it said: {first.said}"
        )
    effects = expected.effects()

    chosen = sorted(set(points)) if points is not None else _pick(calls, sample, seed, target)
    rng = random.Random(f"{seed}:{target}:pairs")
    trials = []
    for i, point in enumerate(chosen):
        trial = sweep.trial(f"k{point}")
        resume = resumes[i % len(resumes)]
        killed = sweep.start(trial, at=point)
        then = None
        ending = "hang: the killed run's child did not end" if killed.hung else ""
        if not ending and pairs and killed.killed:
            then = rng.randint(1, max(calls, 1))
            # a watcher's kill would land in the watcher, not in the run it starts; and
            # a run killed before it existed is started only by the call itself
            how = "call" if resume == "watch" or trial.meta() is None else resume
            interrupted = sweep.resume(trial, how, at=then)
            if interrupted.hung:
                ending = f"hang: the resume killed at {then} did not end"
            elif not interrupted.killed:
                then = None
        ending = (
            ending or sweep.finish(trial, resume) or sweep.compare(trial, status, result, effects)
        )
        trials.append(SweepTrial(point, then, resume, killed.killed, ending, killed.where))
    return SweepResult(target, calls, status, result, tuple(effects), tuple(trials), str(base))


def _pick(calls: int, sample: int | None, seed: str | int | None, target: str) -> list[int]:
    every = list(range(1, calls + 1))
    if sample is None or sample >= calls:
        return every
    rng = random.Random(f"{seed}:{target}")
    return sorted({1, calls, *rng.sample(every[1:-1], max(sample - 2, 0))})


def _entrypoint(job: Any) -> str:
    if isinstance(job, str):
        if ":" not in job:
            raise ValueError(f"a job named by text is 'module:function', not {job!r}")
        return job
    entrypoint = getattr(job, "entrypoint", None)
    if not isinstance(entrypoint, str):
        raise TypeError(f"kill_sweep takes an @afk.durable job or 'module:function', not {job!r}")
    if entrypoint.startswith("__main__:") or "<locals>" in entrypoint:
        raise ValueError(f"{entrypoint} cannot be imported by a child: define it in a module")
    return entrypoint


@dataclass(frozen=True)
class _Child:
    hung: bool
    killed: bool
    calls: int
    where: str
    returncode: int
    said: str = ""
    """The last line the child wrote on stderr (why it failed, when it did)."""


@dataclass(frozen=True)
class _Trial:
    root: Path
    log: Path
    run_id: str

    def effects(self) -> list[str]:
        if not self.log.exists():
            return []
        return self.log.read_text(encoding="utf-8").splitlines()

    @property
    def returned(self) -> Path:
        """What the last call that returned normally returned (msgpack)."""
        return self.root.parent / "returned"

    def meta(self) -> RunMeta | None:
        store = Store(self.root)
        return store.read_meta(self.run_id) if store.exists(self.run_id) else None


class _Sweep:
    """The children of one sweep: how they are started, resumed and judged."""

    def __init__(  # noqa: PLR0917 - private, built in one place
        self,
        target: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        base: Path,
        timeout: float,
        env: dict[str, str],
        run_id: str,
        compare: Callable[[Any], Any] | None,
    ) -> None:
        self.target = target
        self.run_id = run_id
        self.compare_by = compare
        self.params = msgspec.msgpack.encode({"args": list(args), "kwargs": kwargs}).hex()
        self.base = base
        self.timeout = timeout
        self.env = env

    def trial(self, name: str) -> _Trial:
        directory = self.base / name
        directory.mkdir(mode=0o700, parents=True, exist_ok=False)
        return _Trial(directory / "store", directory / "effects.log", self.run_id)

    def start(self, trial: _Trial, *, at: int | None) -> _Child:
        return self._spawn(trial, {"mode": "job", "at": at})

    def resume(self, trial: _Trial, how: str, *, at: int | None = None) -> _Child:
        if how == "call":
            return self._spawn(trial, {"mode": "job", "at": at})
        argv = ["resume", trial.run_id] if how == "resume" else ["watch", "--once"]
        return self._spawn(
            trial, {"mode": "cli", "at": at, "argv": ["--root", str(trial.root), *argv]}
        )

    def finish(self, trial: _Trial, how: str) -> str:
        """Resume until the run ends (a parked run again when due); '' or why it did not."""
        for _ in range(_PARKED_ROUNDS):
            meta = trial.meta()
            if trial.returned.exists():  # a call that returned: code with no run of its own
                return ""
            if meta is None:
                how = "call"  # killed before the run existed: only the call itself starts it
            elif meta.status.is_terminal or meta.status is RunStatus.PAUSED:
                return ""
            elif meta.status is RunStatus.SLEEPING:
                clock = _children_clock(self.env)  # wait until it is due on their clock
                clock.sleep(min(meta.wake_at_ms / 1000 - clock.time(), self.timeout))
            child = self.resume(trial, how)
            if child.hung:
                return f"hang: {how} did not end within {self.timeout} s"
            parked = meta is not None and meta.status is RunStatus.SLEEPING
            if how == "watch" and trial.meta() == meta and not parked:
                left = meta.status if meta else "missing"
                return f"watch --once left the run {left}; it said: {child.said}"
        return f"the run was still {trial.meta()} after {_PARKED_ROUNDS} resumes"

    def ending(self, trial: _Trial) -> tuple[str, Any]:
        """The run's status and result (or error type); for code whose run is not
        ``run_id`` (a LangGraph thread), ``"returned"`` and what the last call returned."""
        meta = trial.meta()
        if meta is not None and meta.status is RunStatus.COMPLETED:
            result = Store(trial.root).open(trial.run_id).resume_state().result
        elif meta is not None and (meta.status.is_terminal or not trial.returned.exists()):
            return str(meta.status), meta.error.type if meta.error is not None else None
        elif trial.returned.exists():
            result = msgspec.msgpack.decode(trial.returned.read_bytes())
            return "returned", result if self.compare_by is None else self.compare_by(result)
        else:
            return "missing", None
        return str(meta.status), result if self.compare_by is None else self.compare_by(result)

    def compare(self, trial: _Trial, status: str, result: Any, effects: list[str]) -> str:
        got_status, got = self.ending(trial)
        want, have = collections.Counter(effects), collections.Counter(trial.effects())
        twice = sorted(line for line in have if have[line] > want[line])
        if twice:
            return f"effects ran more often than uninterrupted: {twice[:5]}"
        if got_status == "failed" and got == "EffectInDoubtError":
            return "in doubt"
        if (got_status, got) != (status, result):
            return f"ended {got_status} with {got!r}, uninterrupted {status} with {result!r}"
        missing = sorted(line for line in want if have[line] < want[line])
        if missing:
            return f"effects missing: {missing[:5]}"
        return "same"

    def _spawn(self, trial: _Trial, spec: dict[str, Any]) -> _Child:
        counted = trial.root.parent / "calls"
        spec = {
            **spec,
            "entrypoint": self.target,
            "root": str(trial.root),
            "run_id": trial.run_id,
            "params": self.params,
            "count": str(counted),
            "returned": str(trial.returned),
        }
        env = {**os.environ, **self.env}
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        env["AFK_LOCAL_ROOT"] = str(trial.root)
        env[SWEEP_LOG_ENV] = str(trial.log)
        counted.unlink(missing_ok=True)
        trial.returned.unlink(missing_ok=True)
        try:
            proc = run_python(_CHILD, [json.dumps(spec)], env=env, timeout=self.timeout)
        except subprocess.TimeoutExpired:
            return _Child(hung=True, killed=False, calls=0, where="", returncode=-9)
        marks = [line for line in proc.stderr.splitlines() if line.startswith(_KILLED_MARK)]
        killed = proc.returncode == -signal.SIGKILL and bool(marks)
        calls = int(counted.read_text()) if counted.exists() else 0
        where = marks[-1][len(_KILLED_MARK) :] if marks else ""
        said = next((line for line in reversed(proc.stderr.splitlines()) if line.strip()), "")
        return _Child(False, killed, calls, where, proc.returncode, said)


def _children_clock(env: Mapping[str, str]) -> Clock:
    """The clock the children read: a ScaledClock given in ``env``, else the wall clock."""
    value = env.get(CLOCK_ENV, "").strip()
    if not value:
        return SystemClock()
    scale, _, origin = value.partition("@")
    return ScaledClock(float(scale), float(origin) if origin else None)


def _child_main(spec_json: str) -> None:
    """Entry point of a sweep's child: count (and maybe kill at) durable I/O, run, report."""
    spec = json.loads(spec_json)
    switch = kill_at_io_call(spec["at"])
    try:
        if spec["mode"] == "cli":
            cli = importlib.import_module("afk_local.cli.main")
            code = cli.main(spec["argv"])
        else:
            code = _call(spec)
    finally:
        Path(spec["count"]).write_text(str(switch.calls), encoding="utf-8")
    raise SystemExit(code)


def _call(spec: dict[str, Any]) -> int:
    from afk_local.errors import RunPaused, RunSleeping  # noqa: PLC0415
    from afk_local.runner.run.durable_function import DurableFunction  # noqa: PLC0415

    module, _, qualname = spec["entrypoint"].partition(":")
    target: Any = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    params = msgspec.msgpack.decode(bytes.fromhex(spec["params"]))
    if isinstance(target, DurableFunction):
        target = target.with_store(Store(spec["root"])).run
    try:
        value = target(*params["args"], run_id=spec["run_id"], **params["kwargs"])
    except RunPaused:
        return EXIT_PAUSED
    except RunSleeping:
        return EXIT_SLEEPING
    Path(spec["returned"]).write_bytes(msgspec.msgpack.encode(value))
    return 0


__all__ = ["RESUMES", "SWEEP_LOG_ENV", "SweepResult", "SweepTrial", "kill_sweep", "record_effect"]
