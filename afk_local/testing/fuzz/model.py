"""The reference model's view of a program's runs, and what it holds the store to.

:class:`RunModel` is what the model knows of one run (its instructions, hence its
result; whether its existence and completion were acknowledged). The checks return
divergences as sentences: :func:`acknowledged_problems` right after a power cut,
:func:`final_problems` once the liveness phase drove every run to its end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from afk_local.storage.format.records import RunStatus
from afk_local.storage.store import Store
from afk_local.testing.fuzz.jobs import read_ledger
from afk_local.testing.fuzz.program import RunSpec, effect_names


@dataclass
class RunModel:
    """What the model knows of one run of the store."""

    spec: RunSpec
    kind: str
    """``job`` (started by the program), ``fork`` or ``import``."""
    expected: dict[str, Any]
    exists: bool = False
    """Acknowledged to exist (an attempt returned, or the fork/import that made it)."""
    completed: bool = False
    """Acknowledged completed: an attempt returned its result."""


def acknowledged_problems(
    store: Store, runs: dict[str, RunModel], removed: set[str], where: str
) -> list[str]:
    """What a power cut lost of what was acknowledged before it, or brought back."""
    problems = []
    on_disk = set(store.run_ids())
    for run_id, model in runs.items():
        if model.exists and run_id not in on_disk:
            problems.append(f"{where}: run {run_id} was acknowledged and is gone")
        if model.completed and run_id in on_disk:
            state = store.open(run_id).resume_state()
            if not state.terminal or state.result != model.expected:
                problems.append(
                    f"{where}: run {run_id} had completed; now status {state.status}, "
                    f"result {state.result!r}"
                )
    for run_id in sorted(on_disk - set(runs)):
        why = "was removed" if run_id in removed else "was never made"
        problems.append(f"{where}: run {run_id} {why} and is listed")
    return problems


def final_problems(store: Store, runs: dict[str, RunModel], ledger: str) -> list[str]:
    """Listings, results, verify and the ledger, once every run finished."""
    problems = []
    listed = {info.run_id: info.status for info in store.runs()}
    if set(listed) != set(runs):
        problems.append(f"listing shows {sorted(listed)}, the model has {sorted(runs)}")
    if store.interrupted():
        problems.append(f"interrupted after every run finished: {store.interrupted()}")
    for run_id, model in runs.items():
        if listed.get(run_id) not in (None, RunStatus.COMPLETED):
            problems.append(f"run {run_id}: listed {listed[run_id]}, not completed")
        state = store.open(run_id).resume_state()
        if not state.terminal or state.result != model.expected:
            problems.append(f"run {run_id}: reads {state.status} {state.result!r}")
        report = store.open(run_id, lazy=True).verify()
        if not report.ok:
            problems.append(f"run {run_id}: verify: {report.problems}")
    return problems + ledger_problems(ledger, runs)


def ledger_problems(ledger: str, runs: dict[str, RunModel]) -> list[str]:
    """Effects that are not idempotent ran at most once; every effect of every run the
    program started (forks and imports inherit theirs) ran at least once."""
    problems = []
    ok: dict[str, int] = {}
    by_run: dict[tuple[str, str], int] = {}
    for entry in read_ledger(ledger):
        if entry["status"] != "ok":
            continue
        by_run[entry["run"], entry["name"]] = by_run.get((entry["run"], entry["name"]), 0) + 1
        if not entry["name"].startswith("istep"):
            ok[entry["key"]] = ok.get(entry["key"], 0) + 1
    for key, count in ok.items():
        if count > 1:
            problems.append(f"effect {key} (not idempotent) ran {count} times")
    for run_id, model in runs.items():
        if model.kind != "job":
            continue
        for name in effect_names(model.spec.instructions):
            if not by_run.get((run_id, name)):
                problems.append(f"run {run_id}: effect {name} never ran, yet the run completed")
    return problems


__all__ = ["RunModel", "acknowledged_problems", "final_problems", "ledger_problems"]
