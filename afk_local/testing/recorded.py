"""Recorded runs as regression tests: replay a job's current code against kept journals.

As Temporal users keep workflow histories, keep a few real runs of a job (a run
directory copied into the test's fixtures with :func:`keep_run`) and replay each one
in a test: a change that would stop them from resuming fails the test, before it
reaches a machine with runs in flight::

    RECORDED = Path(__file__).parent / "recorded"

    @pytest.mark.parametrize("run_dir", sorted(RECORDED.iterdir()), ids=lambda p: p.name)
    def test_checkout_still_replays(run_dir, afk_store):
        afk_local.testing.replay_recorded(run_dir, afk_store, job=checkout)
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from afk_local.errors import RunExistsError
from afk_local.runner.operations.replay_run import replay_run
from afk_local.runner.run.durable_function import DurableFunction
from afk_local.runner.run.replay import ReplayReport
from afk_local.storage.fsio import DIR_MODE, FILE_MODE
from afk_local.storage.store import StoreLike, as_store

_NOT_KEPT = ("owner.lock", "logs")
"""What a kept run leaves behind: its lock (made anew) and the watcher's attempt logs."""


def replay(
    store: StoreLike, run_id: str, *, job: DurableFunction[Any] | None = None
) -> ReplayReport:
    """Replay run ``run_id`` with its job's current code (or ``job``'s), in this process.

    Every journaled call is served from the journal, no step function is called and
    nothing is written to the run.

    >>> afk_local.testing.replay(store, "order-17")  # doctest: +SKIP

    Returns:
        the report, when the code reproduces the run's journal.

    Raises:
        ReplayDivergence: the first place where it does not (position, what the run
            recorded, what the code asks now, what to do).
    """
    report = replay_run(as_store(store), run_id, job=job)
    if report.divergence is not None:
        raise report.divergence
    return report


def keep_run(store: StoreLike, run_id: str, directory: str | os.PathLike[str]) -> Path:
    """Copy run ``run_id`` into ``directory`` (a test's fixtures) as ``directory/run_id``.

    Its checkpoints, journal and ``run.meta`` are copied as they are (not its lock nor
    its logs); a keyed store's runs keep their signatures, so replay them in a store
    with the same key.
    """
    source = as_store(store).paths(run_id, refuse_links=True).dir
    target = Path(directory) / run_id
    shutil.copytree(source, target, ignore=shutil.ignore_patterns(*_NOT_KEPT), symlinks=True)
    return target


def recorded_run(directory: str | os.PathLike[str], store: StoreLike) -> str:
    """Put a kept run directory (:func:`keep_run`) into ``store``; returns its run id.

    Files are made 0600 and directories 0700, as the store's own.

    Raises:
        RunExistsError: the store has a run of that id already.
    """
    source = Path(directory)
    target_store = as_store(store)
    target = target_store.paths(source.name).dir  # validates the id
    if target.exists():
        raise RunExistsError(source.name, str(target))
    os.makedirs(target.parent, mode=DIR_MODE, exist_ok=True)
    shutil.copytree(source, target, ignore=shutil.ignore_patterns(*_NOT_KEPT), symlinks=True)
    for path in [target, *target.rglob("*")]:
        if not path.is_symlink():
            path.chmod(DIR_MODE if path.is_dir() else FILE_MODE)
    return source.name


def replay_recorded(
    directory: str | os.PathLike[str],
    store: StoreLike,
    *,
    job: DurableFunction[Any] | None = None,
) -> ReplayReport:
    """:func:`recorded_run` then :func:`replay`: the one call of a recorded-run test.

    Raises:
        ReplayDivergence: the current code does not reproduce the kept run.
    """
    return replay(store, recorded_run(directory, store), job=job)


__all__ = ["keep_run", "recorded_run", "replay", "replay_recorded"]
