"""Fan-out on Ray: 200 short durable runs through map_durable vs plain Ray tasks.

    python benchmarks/bench_fanout_ray.py [--items 200] [--repeat 3] [--dir DIR]
        [--items-per-task 1 8 16 32]

A local Ray of 2 CPUs on loopback. Each item is one call of ``work(x)`` (no work,
returns ``x * x``). The baseline is one Ray task per item: no run, no file. The
durable form is ``map_durable(square, items)``, the same call inside one
``ctx.step``: per item a run directory, its lock, meta, terminal checkpoint and
the step's intent and outcome (durability "sync"). It runs once per
``--items-per-task`` value (1: one Ray task per item; more: a task runs that many
runs at once on threads, so their fsyncs overlap). A second ``map_durable`` over
the same runs finds them completed and returns the stored results. Each
measurement is the median of ``--repeat`` rounds, the forms interleaved, each
durable round on a fresh store. The machine's load is printed with the numbers:
fsyncs queue behind other processes'. The Dask twin is bench_fanout.py.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import ray  # noqa: E402
from common import table  # noqa: E402

import afk_local as afk  # noqa: E402
from afk_local.integrations.ray import map_durable  # noqa: E402


def work(x: int) -> int:
    """The baseline's whole task."""
    return x * x


@afk.durable
def square(ctx: afk.RunContext, x: int) -> int:
    """``work`` inside one journaled step: the durable twin of the baseline."""
    return int(ctx.step("work", work, x))


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where the stores go (default: a temp dir)")
    parser.add_argument("--items-per-task", type=int, nargs="+", default=[1, 8, 16, 32])
    args = parser.parse_args()

    # workers import this module (the job's home) and afk_local from where this process does
    paths = [str(HERE), *sys.path[1:], os.environ.get("PYTHONPATH", "")]
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        object_store_memory=80 * 1024 * 1024,
        _node_ip_address="127.0.0.1",
    )
    remote_work = ray.remote(work)
    items = list(range(args.items))
    expected = [x * x for x in items]
    base: list[float] = []
    first: dict[int, list[float]] = {k: [] for k in args.items_per_task}
    again: dict[int, list[float]] = {k: [] for k in args.items_per_task}
    try:
        with tempfile.TemporaryDirectory(dir=args.dir, prefix="afk-bench-ray-") as tmp:
            # warm up: both workers start, import afk_local and unpickle the job once
            map_durable(square, [0, 1], store=Path(tmp) / "warm", progress=False)
            ray.get([remote_work.remote(x) for x in range(4)])
            for round_ in range(args.repeat):
                seconds, out = timed(lambda: ray.get([remote_work.remote(x) for x in items]))
                assert out == expected
                base.append(seconds)
                for k in args.items_per_task:
                    store = Path(tmp) / f"store-{round_}-{k}"
                    for series in (first[k], again[k]):
                        seconds, out = timed(
                            map_durable,
                            square,
                            items,
                            store=store,
                            progress=False,
                            items_per_task=k,
                        )
                        assert out == expected
                        series.append(seconds)
    finally:
        ray.shutdown()
    b = statistics.median(base)
    rows = [["Ray tasks (no checkpoints)", f"{b:.3f}", "1.00"]]
    for k in args.items_per_task:
        f, a = statistics.median(first[k]), statistics.median(again[k])
        how = "map_durable" + ("" if k == 1 else f", items_per_task={k}")
        rows += [
            [f"{how}, new runs", f"{f:.3f}", f"{f / b:.2f}"],
            [f"{how}, runs completed", f"{a:.3f}", f"{a / b:.2f}"],
        ]
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"{args.items} items, local Ray with 2 CPUs, median of {args.repeat} rounds "
        f"(load average at the end: {load})"
    )
    print(table(["how", "seconds", "x Ray tasks"], rows))


if __name__ == "__main__":
    import bench_fanout_ray  # the job must live in an importable module, not __main__

    bench_fanout_ray.main()
