"""Metrics benchmark: what ``ctx.metric`` adds to a sync durable run.

Run: python benchmarks/bench_metrics.py [--steps 1000] [--metrics 100000] [--rounds 3] [--dir DIR]

Two ``durability="sync"`` runs of the same job go side by side: ``--steps`` loop
items, each one journaled ``ctx.step`` and one checkpoint (``ctx.iterate``), four
fsyncs per item; the second run also makes ``--metrics`` ``ctx.metric`` calls
(100 per item by default). They run in two threads that take turns item by item
(a turnstile), so both meet the same disk from one millisecond to the next: this
VM's disk latency drifts by several times from minute to minute, and whole runs
one after the other measured that drift, not the metrics. Each run's time is the
sum of its own turns (an item's body, and the checkpoint of the item before it),
in wall time and in its thread's CPU time. The points wait in memory and travel
in the next checkpoint's payload, so they add encoding work, never a write or an
fsync of their own. A last row times the ``ctx.metric`` calls alone (no I/O).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from common import table

import afk_local as afk


def work(i: int) -> int:
    return i * 3


class Turnstile:
    """Two threads taking turns; each adds up the wall and CPU time of its own turns."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.turn = 0
        self.done = [False, False]
        self.wall = [0.0, 0.0]
        self.cpu = [0.0, 0.0]
        self._started = [(0.0, 0.0), (0.0, 0.0)]

    def begin(self, me: int) -> None:
        """Wait for my turn, then start my clock."""
        with self.cond:
            while self.turn != me and not self.done[1 - me]:
                self.cond.wait()
        self._started[me] = (time.perf_counter(), time.thread_time())

    def end(self, me: int, *, finished: bool = False) -> None:
        """Stop my clock and hand the turn over."""
        wall, cpu = self._started[me]
        self.wall[me] += time.perf_counter() - wall
        self.cpu[me] += time.thread_time() - cpu
        with self.cond:
            self.done[me] = self.done[me] or finished
            self.turn = 1 - me
            self.cond.notify_all()


def make_job(store: afk.Store, gate: Turnstile) -> afk.DurableFunction[int]:
    @afk.durable(store=store, durability="sync")
    def job(ctx: afk.RunContext, steps: int, per_item: int, me: int) -> int:
        total = 0
        gate.begin(me)
        for i in ctx.iterate(range(steps), progress=False):
            gate.end(me)  # the previous item's checkpoint is written by now
            gate.begin(me)
            total += ctx.step("work", work, i)
            for k in range(per_item):
                ctx.metric("loss", 1.0 / (i + k + 1))
        gate.end(me, finished=True)
        return total

    return job


def lockstep(base: Path, steps: int, per_item: int) -> tuple[list[float], list[float]]:
    """(wall, CPU) seconds of a plain run [0] and a metered one [1], taking turns."""
    gate = Turnstile()
    stores = [afk.Store(base / "plain"), afk.Store(base / "metered")]
    threads = [
        threading.Thread(
            target=make_job(stores[me], gate).run,
            args=(steps, per_item if me else 0, me),
            kwargs={"run_id": "bench"},
        )
        for me in (0, 1)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    points = len(stores[1].open("bench").metrics())
    assert points == steps * per_item, (points, steps * per_item)
    for store in stores:
        shutil.rmtree(store.root)
    return gate.wall, gate.cpu


def metric_calls_only(calls: int) -> float:
    """Seconds for ``calls`` ``ctx.metric`` calls on a context (no checkpoint, no I/O)."""
    from afk_local.runner.observe.run_report import Reporting, RunReport  # noqa: PLC0415

    class Bare(Reporting):
        def __init__(self) -> None:
            self._report = RunReport()

    ctx = Bare()
    start = time.perf_counter()
    for k in range(calls):
        ctx.metric("loss", 1.0 / (k + 1))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--metrics", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", help="where the stores go (default: a temp dir)")
    args = parser.parse_args()
    per_item = max(1, args.metrics // args.steps)
    n = args.steps * per_item
    base = Path(tempfile.mkdtemp(prefix="afk-bench-metrics-", dir=args.dir))
    rows = []
    ratios = []
    try:
        lockstep(base, 20, per_item)  # warm up
        for r in range(args.rounds):
            wall, cpu = lockstep(base, args.steps, per_item)
            ratios.append(wall[1] / wall[0])
            rows.append(
                [
                    r + 1,
                    f"{wall[0]:.3f}",
                    f"{wall[1]:.3f}",
                    f"{wall[1] / wall[0]:.3f}x",
                    f"{cpu[0]:.3f}",
                    f"{cpu[1]:.3f}",
                    f"{(cpu[1] - cpu[0]) / wall[0] * 100:+.1f}%",
                ]
            )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    calls = metric_calls_only(n)
    print(
        f"{args.steps} sync steps, plain vs with {n:,} ctx.metric calls, item by item; "
        f"stores under {base.parent}"
    )
    print(
        table(
            [
                "round",
                "plain wall s",
                "metered wall s",
                "ratio",
                "plain CPU s",
                "metered CPU s",
                "added CPU / plain wall",
            ],
            rows,
        )
    )
    print(f"the {n:,} calls alone: {calls:.3f} s")
    print(f"median ratio: {statistics.median(ratios):.3f}x (target < 1.05x)")


if __name__ == "__main__":
    main()
