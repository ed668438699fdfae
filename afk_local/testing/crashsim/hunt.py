"""Hunting site mutants: which fsyncs a workload makes, and which workload catches each mutant.

:func:`fsync_sites` records a workload once and counts its fsyncs by call site and
kind; :func:`hunt_mutant` explores a site mutant in each workload that makes its fsync
until one that recovers without the mutant finds a counterexample
(``python -m afk_local.testing.crashsim --mutant sites`` prints the table).
"""

from __future__ import annotations

import ast
import tempfile
from dataclasses import dataclass
from pathlib import Path

import afk_local
from afk_local.testing.crashsim.explorer import (
    DEFAULT_MAX_STATES,
    Exploration,
    explore,
    record,
    scratch_root,
)
from afk_local.testing.crashsim.model import DiskModel
from afk_local.testing.crashsim.mutants import SEAM_FSYNC_METHODS, SITE_MUTANTS
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


def _makes_no_fsync(call: ast.Call) -> bool:
    """The call passes ``sync=False``, ``sync_dir=False`` or ``sync_parent=False``."""
    return any(
        kw.arg in ("sync", "sync_dir", "sync_parent")
        and isinstance(kw.value, ast.Constant)
        and kw.value.value is False
        for kw in call.keywords
    )


def seam_call_sites() -> dict[str, str]:
    """Every function of afk_local's source that calls an fsyncing method of the I/O seam
    (:data:`~.mutants.SEAM_FSYNC_METHODS`), named as the explorer names a site
    (``module.function``), with the file it is in. The seam itself and
    ``afk_local.testing`` are left out."""
    package = Path(afk_local.__file__).parent
    found: dict[str, str] = {}
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        if relative == "storage/fsio.py" or relative.startswith("testing/"):
            continue
        _scan(ast.parse(path.read_text(encoding="utf-8")), None, path.stem, relative, found)
    return found


def _scan(node: ast.AST, function: str | None, module: str, file: str, out: dict[str, str]) -> None:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            _scan(child, child.name, module, file, out)
            continue
        if (
            function is not None
            and isinstance(child, ast.Call)
            and isinstance(child.func, ast.Attribute)
            and child.func.attr in SEAM_FSYNC_METHODS
            and not _makes_no_fsync(child)
        ):
            out.setdefault(f"{module}.{function}", file)
        _scan(child, function, module, file, out)


def recorded_sites() -> dict[tuple[str, str], list[str]]:
    """``(site, kind) -> workloads`` of every fsync that one recording of each workload
    makes."""
    found: dict[tuple[str, str], list[str]] = {}
    for name, workload in WORKLOADS.items():
        for site in fsync_sites(workload):
            found.setdefault(site, []).append(name)
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


__all__ = ["MutantHunt", "fsync_sites", "hunt_mutant", "recorded_sites", "seam_call_sites"]
