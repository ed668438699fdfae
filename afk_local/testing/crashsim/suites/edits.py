"""Workloads of the operations that edit what a run holds: its state, its trust, its metrics.

``afk-local state edit`` (a fork whose state is edited), ``afk-local resume --trust`` of
an imported run, and gc moving the metric points of the checkpoints it deletes to the
run's archive: the explorer holds every crash state to what each acknowledged, as for
the job workloads (:mod:`.workloads`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from afk_local.storage.format.records import IMPORTED_KEY
from afk_local.storage.ops.export import export_records, import_run, to_jsonable
from afk_local.storage.ops.retention import RetentionPolicy
from afk_local.storage.store import Store
from afk_local.storage.trust import trust_run
from afk_local.testing.crashsim.jobs import metered_job
from afk_local.testing.crashsim.trace import Session
from afk_local.testing.crashsim.workloads import Workload, continue_runs, write_run


def _source_setup(store: Store, _scratch: Path) -> None:
    write_run(store, "source", 4, effects=2)


def _edit_record(session: Session, _prepared: Any) -> None:
    session.checkpoints_acked("source", since=0)  # a fork leaves its source alone
    session.store.fork("source", 3, "edited", updates={"i": 99})  # afk-local state edit
    session.checkpoints_acked("edited")  # the edited state, its own checkpoint 4
    session.outcomes_acked("edited")
    session.status_acked("edited")


def _imported_setup(store: Store, scratch: Path) -> None:
    source = Store(scratch / "exporting-store")
    write_run(source, "exported", 3, effects=1)
    text = "\n".join(json.dumps(to_jsonable(r)) for r in export_records(source.open("exported")))
    import_run(store, text, new_run_id="run", source="crashsim export")  # marked imported


def _trust_record(session: Session, _prepared: Any) -> None:
    trust_run(session.store, "run")  # afk-local resume run --trust: the mark goes
    session.meta_acked("run", f"extra.{IMPORTED_KEY}")


def _metered_setup(store: Store, _scratch: Path) -> None:
    # Keyframes only, so gc rewrites nothing between the archive and the deletions (a
    # rewrite's directory fsync would make the archive's name durable for it). New random
    # state in each checkpoint did not ensure it: the delta policy still chose a delta at
    # times, and the recording, and which states a budget draws, varied from run to run.
    store.max_chain = 0
    metered_job.with_store(store).run(5, run_id="metered")


def _metrics_gc_record(session: Session, _prepared: Any) -> None:
    store = session.store
    session.metrics_acked("metered", since=0)  # recorded before: every point stays readable
    session.checkpoints_acked("metered", since=0)
    before = session.position
    store.gc(RetentionPolicy(keep_runtime_states=1))  # the others' points to the archive
    session.checkpoints_released("metered", since=before)
    session.rewrite_done("metered", "gc")


EDIT_WORKLOADS: tuple[Workload, ...] = (
    Workload(
        "fork-edited",
        "afk-local state edit: a fork of a 4-checkpoint run at checkpoint 3 whose state is "
        "edited, written as the fork's own checkpoint 4",
        _edit_record,
        continue_runs("source", "edited"),
        {"source": "resumed", "edited": "resumed"},
        setup=_source_setup,
    ),
    Workload(
        "trust",
        "afk-local resume --trust of an imported run: the import mark cleared in run.meta, "
        "so the run is resumed from then on",
        _trust_record,
        continue_runs("run"),
        {"run": "resumed"},
        setup=_imported_setup,
    ),
    Workload(
        "metrics-gc",
        "gc of a completed run with a metric point per checkpoint: the points of the "
        "checkpoints it deletes moved to the run's metrics archive first",
        _metrics_gc_record,
        continue_runs("metered"),
        {"metered": {"completed": {"count": 5}}},
        setup=_metered_setup,
    ),
)
"""The workloads of run edits, in the order the explorer runs them."""


__all__ = ["EDIT_WORKLOADS"]
