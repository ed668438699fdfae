"""Listing and sweeping a store of many runs, two checkouts side by side (wall and CPU).

    python benchmarks/listing_ab.py BEFORE_CHECKOUT AFTER_CHECKOUT [--runs 100000]
        [--rounds 3] [--dir /dev/shm]

Each checkout gets its own copy of a store built by its own ``benchmarks/many_runs.py``
(their ``runs.index`` formats may differ), listed once so that its index is on disk. Then,
round after round, each side in turn runs, each in a fresh process with that checkout
first on ``PYTHONPATH``: ``python -c pass`` (the interpreter's start-up),
``afk-local runs --limit 50``, and in one process ``Store.runs(limit=50)``, the first of
``Store.iter_runs()``, ``Store.interrupted()`` and the watcher's first and steady sweep.
Prints the median wall and CPU seconds (``resource.getrusage``) per side, and the CPU
ratio: on a loaded machine the CPU says more than the wall time.
"""

from __future__ import annotations

import argparse
import ast
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MEASURE = r"""
import sys, time
import afk_local as afk
from afk_local.watcher.watcher import Watcher
root = sys.argv[1]
def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu
out = {}
out["Store.runs(limit=50)"] = timed(lambda: afk.Store(root).runs(limit=50))
out["first of Store.iter_runs()"] = timed(lambda: next(afk.Store(root).iter_runs()))
out["Store.interrupted()"] = timed(lambda: afk.Store(root).interrupted())
watcher = Watcher(afk.Store(root))
out["watcher first sweep"] = timed(watcher.interrupted)
out["watcher steady sweep"] = timed(watcher.interrupted)
print(repr(out))
"""


def child(command: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """Run ``command`` (from ``/``: ``python -c`` and ``-m`` put the working directory
    first on ``sys.path``, which must not be a checkout); its wall and CPU seconds and
    stdout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True, cwd="/")
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    args = parser.parse_args()
    python = sys.executable
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="afk-listing-ab-") as tmp:
        sides = {}
        for name, checkout in (("before", args.before), ("after", args.after)):
            env = dict(os.environ, PYTHONPATH=str(checkout.resolve()))
            root = str(Path(tmp) / name)
            build = [python, str(checkout / "benchmarks" / "many_runs.py"), root]
            subprocess.run([*build, "--runs", str(args.runs)], env=env, check=True)
            child([python, "-c", f"import afk_local as a; a.Store({root!r}).interrupted()"], env)
            sides[name] = (env, root)
        results: dict[str, dict[str, list[tuple[float, float]]]] = {s: {} for s in sides}
        loads = []
        for _ in range(args.rounds):
            for name, (env, root) in sides.items():
                loads.append(os.getloadavg()[0])
                cli = [python, "-m", "afk_local", "--root", root, "runs", "--limit", "50"]
                for what, command in (
                    ("python -c pass", [python, "-c", "pass"]),
                    (
                        "afk-local runs --limit 50",
                        cli,
                    ),
                ):
                    wall, cpu, _ = child(command, env)
                    results[name].setdefault(what, []).append((wall, cpu))
                out = child([python, "-c", MEASURE, root], env)[2]
                for what, pair in ast.literal_eval(out).items():
                    results[name].setdefault(what, []).append(pair)
    print(f"{args.rounds} rounds, load average (1 min) {min(loads):.1f}-{max(loads):.1f}")
    print("| what | before: wall s | before: CPU s | after: wall s | after: CPU s | CPU ratio |")
    print("|---|---:|---:|---:|---:|---:|")
    for what in results["before"]:
        b = [statistics.median(x) for x in zip(*results["before"][what], strict=True)]
        a = [statistics.median(x) for x in zip(*results["after"][what], strict=True)]
        ratio = f"{a[1] / b[1]:.2f}" if b[1] else "-"
        print(f"| {what} | {b[0]:.3f} | {b[1]:.3f} | {a[0]:.3f} | {a[1]:.3f} | {ratio} |")


if __name__ == "__main__":
    main()
