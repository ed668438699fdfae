"""Hunting site mutants: which fsyncs a workload makes, and which workload catches each mutant.

:func:`fsync_sites` records a workload once and counts its fsyncs by call site and
kind; :func:`hunt_mutant` explores a site mutant in each workload that makes its fsync
until one that recovers without the mutant finds a counterexample
(``python -m afk_local.testing.crashsim --mutant sites`` prints the table).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from afk_local.testing.crashsim.explorer import (
    DEFAULT_MAX_STATES,
    Exploration,
    explore,
    record,
    scratch_root,
)
from afk_local.testing.crashsim.model import DiskModel
from afk_local.testing.crashsim.mutants import SITE_MUTANTS
from afk_local.testing.crashsim.registry import WORKLOADS
from afk_local.testing.crashsim.workloads import Workload


def fsync_sites(workload: str | Workload) -> dict[tuple[str, str], int]:
    """``(site, kind) -> count`` of the fsyncs one recording of ``workload`` makes."""
    chosen = WORKLOADS[workload] if isinstance(workload, str) else workload
    with tempfile.TemporaryDirectory(prefix="afk-crashsim-sites-", dir=scratch_root()) as tmp:
        work = Path(tmp)
        (work / "base").mkdir()
        (work / "scratch").mkdir()
        initial, trace = record(chosen, work / "base", work / "scratch")
    model = DiskModel(initial)
    for op in trace.ops:
        model.apply(op)
    found: dict[tuple[str, str], int] = {}
    for op, kind in model.fsyncs:
        found[(op.site, kind)] = found.get((op.site, kind), 0) + 1
    return found


@dataclass(frozen=True)
class MutantHunt:
    """Where a site mutant was looked for, and the workload that caught it (if one did)."""

    mutant: str
    caught: Exploration | None
    """The exploration that found a counterexample, in a workload that recovers without
    the mutant."""
    tried: tuple[Exploration, ...]
    """Every exploration of the mutant, in the order tried."""
    skipped: tuple[str, ...]
    """Workloads that make this fsync but were passed over: they do not recover even
    without the mutant, so a counterexample there would prove nothing about it."""


def hunt_mutant(
    mutant: str,
    *,
    max_states: int | None = DEFAULT_MAX_STATES,
    depth: int = 1,
    seed: int = 0,
    sites: dict[str, dict[tuple[str, str], int]] | None = None,
    baselines: dict[str, bool] | None = None,
) -> MutantHunt:
    """Explore a site mutant in each workload that makes its fsync until one catches it.

    Only a workload that recovers without the mutant (same budget, depth and seed) may
    catch it. ``sites`` (workload -> :func:`fsync_sites`) and ``baselines`` (workload ->
    recovers) are caches shared across calls.
    """
    site = SITE_MUTANTS[mutant]
    sites = {} if sites is None else sites
    baselines = {} if baselines is None else baselines
    tried: list[Exploration] = []
    skipped: list[str] = []
    for name, workload in WORKLOADS.items():
        if name not in sites:
            sites[name] = fsync_sites(workload)
        if site not in sites[name]:
            continue
        if name not in baselines:
            baselines[name] = explore(workload, max_states=max_states, depth=depth, seed=seed).ok
        if not baselines[name]:
            skipped.append(name)
            continue
        result = explore(workload, mutant=mutant, max_states=max_states, depth=depth, seed=seed)
        tried.append(result)
        if not result.ok:
            return MutantHunt(mutant, result, tuple(tried), tuple(skipped))
    return MutantHunt(mutant, None, tuple(tried), tuple(skipped))


__all__ = ["MutantHunt", "fsync_sites", "hunt_mutant"]
