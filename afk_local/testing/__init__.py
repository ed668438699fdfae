"""Helpers for testing code that uses afk_local: a temporary store and real crashes.

Use as a pytest plugin (in ``conftest.py``)::

    pytest_plugins = ["afk_local.testing"]

    def test_resumes(afk_store):
        killed = run_and_kill(my_job, 100, at=20, on="step", store=afk_store)
        assert killed.killed
        assert my_job.with_store(afk_store).run(run_id=killed.run_id) == expected

:func:`run_and_kill` runs a durable job in a fresh child process (``python -c``,
never a fork of the caller) and SIGKILLs it at a chosen point, so the crash is as real
as an OOM kill: no ``finally`` blocks, no atexit, no flushed buffers. The job must be
importable (``module:qualname``) by the child; the child gets this process's
``sys.path``. Inside :func:`using_fork_server` the child is a fresh fork of a server
that imported afk_local once and holds nothing else (no store, lock or writer), which
saves each child the interpreter's start-up (:mod:`afk_local.testing.forkserver`).

:func:`kill_sweep` (also the ``kill_sweep`` fixture) kills a job at each of its durable
I/O calls in turn, resumes it as a user would and compares every ending with an
uninterrupted run's (docs/testing.md).
:func:`replay` runs a job's current code against a run's journal (calling nothing,
writing nothing) and raises :class:`~afk_local.ReplayDivergence` where it departs from
it; :func:`keep_run` and :func:`replay_recorded` keep real runs as regression tests.

Tests of sleeps, retries, limits and schedules use :class:`SkippingClock` (the
``afk_clock`` fixture, or ``with skipping_clock():``): every durable wait returns at
once and moves the clock forward (docs/time.md).
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
import json
import os
import signal
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from afk_local.errors import RunPaused, RunSleeping
from afk_local.runner.operations.resume import load_entrypoint
from afk_local.runner.run import run_context
from afk_local.runner.run.durable_function import DurableFunction
from afk_local.storage.format.layout import new_run_id
from afk_local.storage.fsio import Env, IoCall
from afk_local.storage.store import Store
from afk_local.testing.clock import ScaledClock, SkippingClock, skipping_clock
from afk_local.testing.forkserver import run_python, using_fork_server
from afk_local.testing.kills import EXIT_PAUSED, EXIT_SLEEPING, IoKillSwitch, kill_at_io_call
from afk_local.testing.recorded import keep_run, recorded_run, replay, replay_recorded
from afk_local.testing.sweep import (
    RESUMES,
    SWEEP_LOG_ENV,
    SweepResult,
    SweepTrial,
    kill_sweep,
    record_effect,
)

# The fixtures exist only under pytest (which has always been imported by the time it
# loads this plugin). A child process that imports this package to be killed
# (run_and_kill, kill_sweep, the fuzzer) skips pytest's ~0.3 s import.
if "pytest" in sys.modules:
    import pytest
else:
    pytest = None  # type: ignore[assignment]

KILL_POINTS = (
    "io",
    "step",
    "open",
    "write",
    "fsync",
    "rename",
    "symlink",
    "link",
    "unlink",
    "truncate",
    "mkdir",
)
"""What ``run_and_kill(at=N, on=...)`` counts: every durable I/O call (``"io"``), journaled
steps (``"step"``), or one kind of I/O call."""

_CHILD = "import sys; from afk_local.testing import _child_main; _child_main(sys.argv[1])"


@dataclass(frozen=True)
class KillResult:
    """What happened to the child of :func:`run_and_kill`."""

    run_id: str
    killed: bool
    """True when the child was SIGKILLed at the kill point (False: it finished first)."""
    returncode: int
    stdout: str
    stderr: str

    @property
    def completed(self) -> bool:
        """True when the job returned normally in the child."""
        return self.returncode == 0

    @property
    def paused(self) -> bool:
        """True when the job paused (``ctx.pause``) in the child."""
        return self.returncode == EXIT_PAUSED


def run_and_kill(
    job: DurableFunction[Any],
    *args: Any,
    at: int | None,
    on: str = "io",
    store: Store | str | os.PathLike[str] | None = None,
    run_id: str | None = None,
    timeout: float = 120.0,
    **kwargs: Any,
) -> KillResult:
    """Run ``job.run(*args, run_id=run_id, **kwargs)`` in a child process; SIGKILL it at ``at``.

    Args:
        job: an ``@afk.durable`` function importable as ``module:qualname``.
        at: kill right before the ``at``-th event counted by ``on`` (1-based);
            None runs the job to its end (a plain resume in a child).
        on: ``"io"`` counts every durable I/O call of :mod:`afk_local.storage.fsio`
            (open, write, fsync, rename, ...), one of those names counts only
            that kind, ``"step"`` counts ``ctx.step`` calls (killed before the
            step's intent is written).
        store: where the run lives (default: the job's store, else ``$AFK_LOCAL_ROOT``).
        run_id: the run to start or resume (default: a new id, returned in the result).
        timeout: seconds before the child is killed regardless (then ``killed`` is False
            and the returncode is -9).

    Returns:
        A :class:`KillResult`; read the run with ``Store(root).open(result.run_id)``.
    """
    if on not in KILL_POINTS:
        raise ValueError(f"on must be one of {', '.join(KILL_POINTS)}, not {on!r}")
    if at is not None and at < 1:
        raise ValueError("at counts from 1")
    if job.entrypoint.startswith("__main__:") or "<locals>" in job.entrypoint:
        raise ValueError(
            f"{job.entrypoint} cannot be imported by a child process: define the job in a module"
        )
    target = store if store is not None else job.store
    root = str(target.root if isinstance(target, Store) else Store(target).root)
    run_id = run_id or new_run_id()
    spec = {
        "entrypoint": job.entrypoint,
        "root": root,
        "run_id": run_id,
        "params": msgspec.msgpack.encode({"args": list(args), "kwargs": kwargs}).hex(),
        "at": at,
        "on": on,
    }
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    proc = run_python(_CHILD, [json.dumps(spec)], env=env, timeout=timeout)
    return KillResult(
        run_id=run_id,
        killed=proc.returncode == -signal.SIGKILL and "afk-testing: killing" in proc.stderr,
        returncode=proc.returncode,
        stdout=proc.stdout,
        stderr=proc.stderr,
    )


def _child_main(spec_json: str) -> None:
    """Entry point of the child process of :func:`run_and_kill`."""
    spec = json.loads(spec_json)
    at, on = spec["at"], spec["on"]
    seen = 0

    def kill(event: str, detail: str) -> None:
        nonlocal seen
        seen += 1
        if seen == at:
            sys.stderr.write(f"afk-testing: killing at {event} #{seen} ({detail})\n")
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    if at is not None and on == "step":
        run_context.set_step_hook(kill)
    elif at is not None:
        kill_at_io_call(at, on)
    job = load_entrypoint(spec["entrypoint"], spec["run_id"])
    store = Store(spec["root"])
    params = msgspec.msgpack.decode(bytes.fromhex(spec["params"]))
    try:
        job.with_store(store).run(*params["args"], run_id=spec["run_id"], **params["kwargs"])
    except RunPaused:
        raise SystemExit(EXIT_PAUSED) from None
    except RunSleeping:
        raise SystemExit(EXIT_SLEEPING) from None


SWEEP_SAMPLE = 2
"""Kill points a sampled sweep (the ``kill_sweep`` fixture without ``--torture``) tries."""


if pytest is not None:

    def pytest_addoption(parser: pytest.Parser) -> None:
        """``--torture``: the ``kill_sweep`` fixture tries every kill point, and pairs."""
        # a project with its own --torture keeps it (ValueError); the fixture reads it
        with contextlib.suppress(ValueError):
            parser.addoption(
                "--torture",
                action="store_true",
                default=False,
                help="long crash suites: every kill point of kill_sweep, and kills in resumes",
            )

    @pytest.fixture(name="kill_sweep")
    def _kill_sweep_fixture(
        request: pytest.FixtureRequest, tmp_path: Path
    ) -> Callable[..., SweepResult]:
        """:func:`kill_sweep` for a test: sampled, or every point and pairs under ``--torture``.

        The sample is drawn from ``$AFK_KILL_SEED`` (default: today's date) and the test's
        id, so each day tries other points; stores go under the test's ``tmp_path``.
        Keyword options given to the call win.
        """
        torture = bool(request.config.getoption("--torture", default=False))
        seed = os.environ.get("AFK_KILL_SEED") or datetime.date.today().isoformat()
        count = itertools.count()

        def sweep(job: Any, *args: Any, **kwargs: Any) -> SweepResult:
            options: dict[str, Any] = {
                "sample": None if torture else SWEEP_SAMPLE,
                "pairs": torture,
                "seed": f"{seed}:{request.node.nodeid}",
                "workdir": tmp_path / f"sweep-{next(count)}",
            }
            return kill_sweep(job, *args, **{**options, **kwargs})

        return sweep

    @pytest.fixture
    def afk_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
        """A :class:`~afk_local.Store` in a temporary directory, also set as ``$AFK_LOCAL_ROOT``.

        Jobs declared with ``store=None`` write there too during the test.
        """
        root = tmp_path / "afk-store"
        monkeypatch.setenv("AFK_LOCAL_ROOT", str(root))
        yield Store(root)

    @pytest.fixture
    def afk_clock() -> Iterator[SkippingClock]:
        """A :class:`SkippingClock` installed for the test: durable waits return at once."""
        with skipping_clock() as clock:
            yield clock


__all__ = [
    "EXIT_PAUSED",
    "EXIT_SLEEPING",
    "KILL_POINTS",
    "RESUMES",
    "SWEEP_LOG_ENV",
    "SWEEP_SAMPLE",
    "Env",
    "IoCall",
    "IoKillSwitch",
    "KillResult",
    "ScaledClock",
    "SkippingClock",
    "SweepResult",
    "SweepTrial",
    "afk_clock",
    "afk_store",
    "keep_run",
    "kill_at_io_call",
    "kill_sweep",
    "record_effect",
    "recorded_run",
    "replay",
    "replay_recorded",
    "run_and_kill",
    "skipping_clock",
    "using_fork_server",
]
