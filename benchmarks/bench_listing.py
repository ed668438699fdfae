"""Listings and the watcher's sweep on a store of many runs (issue 44).

    python benchmarks/bench_listing.py --dir /tmp/bench-listing [--runs 100000] [--rounds 3]

Builds (once; ``--dir`` keeps it for the next call) a store of ``--runs`` finished runs
with :mod:`many_runs`, each told to ``runs.changes`` as the library's writers tell it,
and keeps a copy of that file. Then, per round, in interleaved order:

- **first**: ``afk-local runs --limit 50`` right after the bulk of creations (no
  ``runs.index`` yet, ``runs.changes`` as the writers left it);
- **warm**: the same command once a listing has saved the index;
- **untold**: the first listing of the same store as an older afk_local left it (no
  ``runs.index``, no ``runs.changes``): every run's meta is read (``--untold``; slow);

each a fresh process, reported beyond ``python -c pass`` measured in the same round
(so the CLI's imports are in it), and the same listings in this process (``in-process``:
``Store(root).runs(limit=50)`` on a fresh Store, imports done).
And the watcher's sweeps in one process: the first (every meta checked), the steady one
(nothing changed: ``runs.changes`` read, candidates and a slice of the runs checked), and
the full safety sweep (every run's meta stat-checked) that it replaces.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from many_runs import build_store

from afk_local.storage.meta_index import INDEX_NAME
from afk_local.storage.rundir.run_changes import CHANGES_NAME
from afk_local.storage.store import Store
from afk_local.watcher.watcher import Watcher

ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
"""Children write and use bytecode caches, as an installed afk_local does."""


def timed(cmd: list[str]) -> float:
    """Seconds one run of ``cmd`` takes (its output dropped)."""
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=ENV)
    return time.perf_counter() - t0


def listing(root: Path) -> list[str]:
    """``afk-local runs --limit 50`` of the store at ``root``."""
    return [sys.executable, "-m", "afk_local", "--root", str(root), "runs", "--limit", "50"]


def reset(root: Path, saved_changes: Path | None) -> None:
    """The store as the bulk of creations left it: no index, the writers' records
    (``saved_changes``; None: no records, as an older afk_local leaves a store)."""
    (root / INDEX_NAME).unlink(missing_ok=True)
    (root / CHANGES_NAME).unlink(missing_ok=True)
    if saved_changes is not None:
        shutil.copyfile(saved_changes, root / CHANGES_NAME)
        os.chmod(root / CHANGES_NAME, 0o600)


def sweeps(root: Path, rounds: int) -> dict[str, list[float]]:
    """The watcher's first, steady and full safety sweeps, in one process."""
    watcher = Watcher(Store(root))
    t0 = time.perf_counter()
    watcher.sweep()
    out: dict[str, list[float]] = {"sweep, first": [time.perf_counter() - t0]}
    watcher.pending.clear()
    for _ in range(rounds):
        for name, full in (("sweep, steady", False), ("sweep, full safety", True)):
            t0 = time.perf_counter()
            watcher.sweep(full=full)
            out.setdefault(name, []).append(time.perf_counter() - t0)
            watcher.pending.clear()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, help="where the store is kept (default: a temp dir)")
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--untold", action="store_true", help="also the store without records")
    args = parser.parse_args()
    base = args.dir or Path(tempfile.mkdtemp(prefix="afk-bench-listing-"))
    root = base / f"store-{args.runs}"
    saved = base / f"changes-{args.runs}"
    if not saved.exists():
        shutil.rmtree(root, ignore_errors=True)
        t0 = time.perf_counter()
        build_store(root, args.runs)
        shutil.copyfile(root / CHANGES_NAME, saved)
        print(f"built {args.runs} runs in {time.perf_counter() - t0:.0f} s at {root}")
    subprocess.run([*listing(root), "--json"], check=True, stdout=subprocess.DEVNULL, env=ENV)
    results: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        start = timed([sys.executable, "-c", "pass"])
        cases = [("first", saved), ("warm", None)]
        if args.untold and not results.get("untold (older store)"):  # once: it is slow
            cases.insert(0, ("untold (older store)", None))
        for name, changes in cases:
            if name != "warm":
                reset(root, changes)
            results.setdefault(name, []).append(timed(listing(root)) - start)
        results.setdefault("python -c pass", []).append(start)
        for name, changes in (("first, in-process", saved), ("warm, in-process", None)):
            if changes is not None:
                reset(root, changes)
            t0 = time.perf_counter()
            Store(root).runs(limit=50)
            results.setdefault(name, []).append(time.perf_counter() - t0)
    for name, times in sweeps(root, args.rounds).items():
        results[name] = times
    print(f"\n{args.runs} runs, {args.rounds} rounds, load {os.getloadavg()[0]:.1f}")
    print(f"{'case':32} {'median s':>9} {'min s':>7}")
    for name, times in results.items():
        label = name if name.startswith(("sweep", "python")) else f"runs --limit 50, {name}"
        print(f"{label:32} {statistics.median(times):9.3f} {min(times):7.3f}")
    print("(listings: seconds beyond `python -c pass`; sweeps: in one watcher process)")


if __name__ == "__main__":
    main()
