"""Replaying one run of the store with its job's current code (``afk-local replay RUN``).

The job is found as a resume finds it (:func:`~afk_local.runner.operations.resume.load_job`),
through the same trust gate, then :func:`~afk_local.runner.run.replay.replay_job` runs it
against the run's journal: nothing is called, nothing is written.
"""

from __future__ import annotations

from typing import Any

from afk_local.runner.operations.resume import load_job
from afk_local.runner.run.durable_function import DurableFunction
from afk_local.runner.run.replay import ReplayReport, replay_job
from afk_local.storage.store import Store
from afk_local.storage.trust import require_trusted_run


def replay_run(
    store: Store,
    run_id: str,
    *,
    job: DurableFunction[Any] | None = None,
    reenter: bool = False,
) -> ReplayReport:
    """Replay run ``run_id`` with its job's current code (or ``job``'s) and report.

    ``reenter``: this process was started for this one replay (``afk-local replay``):
    it may go back to where the job ran to find it, as a resume does.

    Raises:
        UntrustedStoreError: the trust gate refused the run (nothing was imported or run).
        EntrypointError: its job cannot be found here.
    """
    trusted = require_trusted_run(store, run_id, from_origin=True)  # before anything runs
    if job is None:
        job = load_job(trusted, reenter=reenter)
    report, _ = replay_job(job.fn, store, trusted.meta, version=job.version)
    return report


__all__ = ["replay_run"]
