"""The web page on a large store: ``afk-local ui`` serving 10,000 runs and a long run.

Run: python benchmarks/bench_ui.py [--runs 10000] [--checkpoints 50000] [--dir DIR]
[--rounds 3] [--whole]

Builds (once; a second run with the same ``--dir`` reuses it) a store of ``--runs``
finished runs, each with a tag, a checkpoint with progress and a few hundred bytes,
:data:`STUCK` runs a crash left (interrupted), and one run of ``--checkpoints``
checkpoints recording no metrics (built with fsync off: a fixture, not what is timed).
While it measures, the benchmark's own process holds :data:`LIVE` runs open (live).
Then it starts a real ``afk-local ui`` process on the store and times, over HTTP on
loopback: the first runs page (``/``, 50 runs), the rows the page polls
(``/runs/rows``), filtered pages (a tag, ``status=live``, ``status=interrupted``),
page 100, a run's page, ``/store`` (its first answer, while the figures are read off the
request, and once they are read), the long run's page and one of its checkpoints'
pages, and the size of each answer.

The machine may be shared, so each request is timed interleaved with a baseline in the
same round: :func:`baseline` (the info of :data:`BASELINE_RUNS` runs read in the
benchmark's process, the kind of work a page does). The table gives each request's
time, the server's CPU time for it (from ``/proc``: what the request cost, whatever the
other processes took of the machine), its size, and its time as a ratio to the baseline
timed next to it (the median of the rounds' ratios), and that ratio times the baseline's
CPU seconds: an estimate of the request's time on a machine to itself. ``--whole`` also times
reading every run's info (what ``/?status=live`` cost before it decided runs by their lock).
"""

from __future__ import annotations

import argparse
import contextlib
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


STUCK = 5
"""Runs a crash left behind in the built store (status running, nobody holds the lock)."""
LIVE = 3
"""Runs the benchmark's process holds open while it measures (their owner is alive)."""
BASELINE_RUNS = 100
"""Runs whose info one baseline reads."""


def build_stuck(root: Path) -> None:
    """:data:`STUCK` runs that were never finished: a crash left them (interrupted)."""
    store = afk.Store(root)
    for i in range(STUCK):
        run_id = f"stuck-{i}"
        if not store.exists(run_id):
            with store.create(run_id) as run:
                run.checkpoint("runtime_state", {"i": i}, step=0)


BASE_CPU: list[float] = []
"""The CPU seconds of every baseline timed (what one costs on a machine to itself)."""


def baseline(store: afk.Store, run_ids: list[str]) -> float:
    """Seconds to read the info of ``run_ids`` in this process (meta, newest checkpoint,
    lock, directory): a fixed amount of the work a page does, timed next to each request.
    Its CPU seconds are kept in :data:`BASE_CPU`."""
    started, cpu = time.perf_counter(), time.process_time()
    for run_id in run_ids:
        store.info(run_id)
    BASE_CPU.append(time.process_time() - cpu)
    return time.perf_counter() - started


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used, from ``/proc`` (0 elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            fields = fh.read().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def get(url: str, cookie: str) -> int:
    """GET ``url``; the size of the answer."""
    request = urllib.request.Request(url, headers={"Cookie": cookie})
    with urllib.request.urlopen(request, timeout=600) as answer:
        return len(answer.read())


def store_figures_read(url: str, cookie: str) -> float:
    """Wait until /store shows its figures; returns how long that took."""
    started = time.perf_counter()
    while True:
        request = urllib.request.Request(url, headers={"Cookie": cookie})
        with urllib.request.urlopen(request, timeout=600) as answer:
            if b"Figures read" in answer.read():
                return time.perf_counter() - started
        time.sleep(0.2)


class Timing:
    """One request's rounds: wall seconds, server CPU seconds, ratio to the baseline."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self.ratio: list[float] = []
        self.size = 0

    def row(self, base_cpu: float) -> str:
        """The table's line; ``base_cpu``: the baseline's CPU seconds (its time on a quiet
        machine), which the ratio turns into an estimate of this request's."""
        ratio = statistics.median(self.ratio)
        return (
            f"{self.label:<36} {min(self.wall):>7.3f} {statistics.median(self.wall):>8.3f} "
            f"{statistics.median(self.cpu):>7.2f} {self.size / 1000:>7.1f} "
            f"{ratio:>8.2f}x {ratio * base_cpu:>8.3f}"
        )


def timed(
    timing: Timing, url: str, cookie: str, pid: int, store: afk.Store, sample: list[str]
) -> None:
    """One round of ``url``, with the baseline timed just before it."""
    base = baseline(store, sample)
    cpu = cpu_s(pid)
    started = time.perf_counter()
    timing.size = get(url, cookie)
    wall = time.perf_counter() - started
    timing.cpu.append(cpu_s(pid) - cpu)
    timing.wall.append(wall)
    timing.ratio.append(wall / base)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--checkpoints", type=int, default=50_000)
    parser.add_argument("--whole", action="store_true", help="also time reading every run")
    args = parser.parse_args()
    base = args.dir or Path(tempfile.mkdtemp(prefix="bench-ui-"))
    root = base / "store"
    build(root, args.runs)
    build_stuck(root)
    build_long(root, args.checkpoints)
    from ui_server import served  # noqa: PLC0415 - tests/support is put on sys.path above

    store = afk.Store(root)
    sample = [f"run-{i:05d}" for i in range(0, args.runs, max(1, args.runs // BASELINE_RUNS))]
    kept = len(store.open(LONG_RUN).checkpoint_files()) if args.checkpoints else 0
    loads = [os.getloadavg()[0]]
    with contextlib.ExitStack() as held, served(root) as server:
        for i in range(LIVE):
            run = held.enter_context(store.create(f"live-{os.getpid()}-{i}"))
            run.checkpoint("runtime_state", {"i": i}, step=0)
            held.callback(run.finish, i)
        cookie = f"{server.cookie_name}={server.token}"
        pid = server.process.pid
        first = Timing("/store, first answer")
        timed(first, server.base + "/store", cookie, pid, store, sample)
        reading = store_figures_read(server.base + "/store", cookie)
        pages = [
            ("first runs page (/)", "/"),
            ("rows the page polls", "/runs/rows"),
            ("filtered (tag model=small)", "/?tag=model%3Dsmall"),
            ("filtered (status=live)", "/?status=live"),
            ("filtered (status=interrupted)", "/?status=interrupted"),
            ("page 100", "/?page=100"),
            ("one run's page", f"/runs/run-{min(42, args.runs - 1):05d}"),
            ("/store, figures read", "/store"),
        ]
        if args.checkpoints:
            pages += [
                (f"long run's page ({kept} ckpts)", f"/runs/{LONG_RUN}"),
                ("a checkpoint of the long run", f"/runs/{LONG_RUN}/checkpoints/{kept // 2}"),
            ]
        timings = [Timing(label) for label, _ in pages]
        for _ in range(args.rounds):  # round by round: a burst of load hits every request
            for timing, (_, path) in zip(timings, pages, strict=True):
                timed(timing, server.base + path, cookie, pid, store, sample)
            loads.append(os.getloadavg()[0])
    print(f"store: {len(store.run_ids())} runs at {root}; load average (1 min) during the run:")
    print(f"  {min(loads):.1f}-{max(loads):.1f} ({os.cpu_count()} CPUs)")
    print(f"/store's figures were read off the request in {reading:.1f} s")
    base_cpu = statistics.median(BASE_CPU)
    print(f"baseline: the info of {len(sample)} runs, {base_cpu:.3f} CPU s (median)")
    print(
        f"{'request':<36} {'best s':>7} {'median s':>8} {'CPU s':>7} {'KB':>7} {'vs base':>9} "
        f"{'quiet s':>8}"
    )
    for timing in [first, *timings]:
        print(timing.row(base_cpu))
    if args.whole:  # what /?status=live cost when it read every run
        base = baseline(store, sample)
        every = store.run_ids()
        took = baseline(store, every)
        print(
            f"every run's info ({len(every)} runs: what /?status=live read before): "
            f"{took:.3f} s, {took / base:.2f}x the baseline"
        )


if __name__ == "__main__":
    main()
