"""The web page on a large store: ``afk-local ui`` serving 10,000 runs and a long run.

Run: python benchmarks/bench_ui.py [--runs 10000] [--checkpoints 50000] [--dir DIR] [--rounds 3]

Builds (once; a second run with the same ``--dir`` reuses it) a store of ``--runs``
finished runs, each with a tag, a checkpoint with progress and a few hundred bytes,
and one run of ``--checkpoints`` checkpoints recording no metrics (built with fsync
off: a fixture, not what is timed), then starts a real ``afk-local ui`` process on it
and times, over HTTP on loopback: the first runs page (``/``, 50 runs), the rows the
page polls every second (``/runs/rows``), a filtered page (``?tag=model=small``), a
run's page, ``/store`` (its first answer, while the figures are read off the request,
and once they are read), the long run's page and one of its checkpoints' pages, and
the size of each answer. The baseline in the same process is ``store.runs()``: listing
the whole store, what a page would cost if it listed everything first.
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
sys.path.insert(0, str(Path(__file__).parent))

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


LONG_RUN = "long-run"


def build_long(root: Path, checkpoints: int) -> None:
    """One run of ``checkpoints`` checkpoints and no metrics (fsync off: a fixture)."""
    from common import no_fsync  # noqa: PLC0415 - benchmarks/ is on sys.path when run

    store = afk.Store(root)
    if checkpoints <= 0 or store.exists(LONG_RUN):
        return
    started = time.perf_counter()
    with no_fsync(), store.create(LONG_RUN) as run:
        for i in range(checkpoints):
            progress = {"steps": i, "done": i, "total": checkpoints, "unit": "items"}
            run.checkpoint("runtime_state", {PROGRESS_KEY: progress, "state": {"i": i}}, step=0)
        run.finish({"items": checkpoints})
    print(
        f"  built {LONG_RUN}: {checkpoints} checkpoints ({time.perf_counter() - started:.0f} s)",
        file=sys.stderr,
    )


def timed(url: str, rounds: int, cookie: str) -> tuple[list[float], int]:
    """Seconds of each of ``rounds`` GETs of ``url``, and the size of the last answer."""
    times, size = [], 0
    for _ in range(rounds):
        started = time.perf_counter()
        request = urllib.request.Request(url, headers={"Cookie": cookie})
        with urllib.request.urlopen(request, timeout=300) as answer:
            size = len(answer.read())
        times.append(time.perf_counter() - started)
    return times, size


def store_figures_read(url: str, cookie: str) -> float:
    """Wait until /store shows its figures; returns how long that took."""
    started = time.perf_counter()
    while True:
        request = urllib.request.Request(url, headers={"Cookie": cookie})
        with urllib.request.urlopen(request, timeout=300) as answer:
            if b"Figures read" in answer.read():
                return time.perf_counter() - started
        time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--checkpoints", type=int, default=50_000)
    args = parser.parse_args()
    base = args.dir or Path(tempfile.mkdtemp(prefix="bench-ui-"))
    root = base / "store"
    build(root, args.runs)
    build_long(root, args.checkpoints)
    from ui_server import served  # noqa: PLC0415 - tests/support is put on sys.path above

    started = time.perf_counter()
    listed = len(afk.Store(root).runs())
    whole = time.perf_counter() - started
    kept = len(afk.Store(root).open(LONG_RUN).checkpoint_files()) if args.checkpoints else 0
    rows = []
    with served(root) as server:
        cookie = f"{server.cookie_name}={server.token}"
        first_store, store_size = timed(server.base + "/store", 1, cookie)
        rows.append(("/store, first answer", first_store[0], first_store[0], store_size))
        reading = store_figures_read(server.base + "/store", cookie)
        pages = [
            ("first runs page (/)", "/"),
            ("rows the page polls", "/runs/rows"),
            ("filtered (tag model=small)", "/?tag=model%3Dsmall"),
            ("page 100", "/?page=100"),
            ("one run's page", "/runs/run-00042"),
            ("/store, figures read", "/store"),
        ]
        if args.checkpoints:
            pages += [
                (f"long run's page ({kept} ckpts)", f"/runs/{LONG_RUN}"),
                ("a checkpoint of the long run", f"/runs/{LONG_RUN}/checkpoints/{kept // 2}"),
            ]
        for label, path in pages:
            times, size = timed(server.base + path, args.rounds, cookie)
            rows.append((label, min(times), statistics.median(times), size))
    print(f"store: {listed} runs at {root} (pid {os.getpid()}); load average {os.getloadavg()}")
    print(f"/store's figures were read off the request in {reading:.1f} s")
    header = f"{'request':<34} {'best s':>8} {'median s':>9} {'KB':>8} {'vs store.runs()':>16}"
    print(header)
    for label, best, median, size in rows:
        print(f"{label:<34} {best:>8.3f} {median:>9.3f} {size / 1000:>8.1f} {best / whole:>15.2f}x")
    print(f"{'baseline: store.runs() whole':<34} {whole:>8.3f}")


if __name__ == "__main__":
    main()
