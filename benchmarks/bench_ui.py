"""The web page's runs page on a large store: ``afk-local ui`` serving 10,000 runs.

Run: python benchmarks/bench_ui.py [--runs 10000] [--dir DIR] [--rounds 3]

Builds (once; a second run with the same ``--dir`` reuses it) a store of ``--runs``
finished runs, each with a tag, a checkpoint with progress and a few hundred bytes,
then starts a real ``afk-local ui`` process on it and times, over HTTP on loopback:
the first runs page (``/``, 50 runs), the rows the page polls every second
(``/runs/rows``), a filtered page (``?tag=model=small``) and a run's page. The
baseline in the same process is ``store.runs()``: listing the whole store, what a
page would cost if it listed everything first.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "tests" / "support"))

import afk_local as afk
from afk_local.storage.views.run_progress import PROGRESS_KEY


def build(root: Path, runs: int) -> None:
    store = afk.Store(root)
    have = set(store.run_ids()) if store.runs_dir.is_dir() else set()
    started = time.perf_counter()
    for i in range(runs):
        run_id = f"run-{i:05d}"
        if run_id in have:
            continue
        model = ("small", "large")[i % 2]
        with store.create(run_id, extra={"tags": {"model": model}}) as run:
            payload = {PROGRESS_KEY: {"steps": 10, "done": 10, "total": 10, "unit": "items"}}
            run.checkpoint("runtime_state", payload, step=10)
            run.finish({"i": i})
        if i and i % 1000 == 0:
            print(f"  built {i} runs ({time.perf_counter() - started:.0f} s)", file=sys.stderr)


def timed(url: str, rounds: int) -> list[float]:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        with urllib.request.urlopen(url, timeout=120) as answer:
            answer.read()
        times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    base = args.dir or Path(tempfile.mkdtemp(prefix="bench-ui-"))
    root = base / "store"
    build(root, args.runs)
    from ui_server import served  # noqa: PLC0415 - tests/support is put on sys.path above

    started = time.perf_counter()
    listed = len(afk.Store(root).runs())
    whole = time.perf_counter() - started
    rows = []
    with served(root) as server:
        token = f"token={server.token}"
        for label, path in (
            ("first runs page (/)", f"/?{token}"),
            ("rows the page polls", f"/runs/rows?{token}"),
            ("filtered (tag model=small)", f"/?tag=model%3Dsmall&{token}"),
            ("page 100", f"/?page=100&{token}"),
            ("one run's page", f"/runs/run-00042?{token}"),
        ):
            times = timed(server.base + path, args.rounds)
            rows.append((label, min(times), statistics.median(times)))
    print(f"store: {listed} runs at {root} (pid {os.getpid()})")
    print(f"{'request':<30} {'best s':>8} {'median s':>9} {'vs store.runs()':>16}")
    for label, best, median in rows:
        print(f"{label:<30} {best:>8.3f} {median:>9.3f} {best / whole:>15.2f}x")
    print(f"{'baseline: store.runs() whole':<30} {whole:>8.3f}")


if __name__ == "__main__":
    main()
