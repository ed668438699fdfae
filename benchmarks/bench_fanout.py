"""Fan-out on Dask: 200 short durable runs through map_durable vs plain client.map.

    python benchmarks/bench_fanout.py [--items 200] [--work-ms 0 10] [--repeat 3] [--dir DIR]
        [--items-per-task default 1 16]

A Dask LocalCluster of 2 worker processes (1 thread each, loopback). Each item
is one call of ``work(x)``, which spins for ``--work-ms`` of CPU and returns
``x * x``. The baseline is ``client.map(work, items)``: no run, no file. The
durable form is ``map_durable(square, items)``, where ``square`` is the same
call inside one ``ctx.step``: per item a run directory with its lock and meta,
its ``run_terminal`` checkpoint and the step's intent and outcome, 7 fsyncs
(durability "sync"). It runs once per ``--items-per-task`` value (``default``: no
``items_per_task``, map_durable chooses the chunking itself; 1: one Dask task per
item, as ``client.map``; more: a task runs that many runs at once on threads, so
their fsyncs overlap). A second ``map_durable`` over the same runs finds them
completed and returns the stored results. Each measurement takes the median of
``--repeat`` rounds, the forms interleaved, each durable round on a fresh store.
Print the machine's load with the numbers: fsyncs queue behind other processes'.
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

from common import table  # noqa: E402
from distributed import Client, LocalCluster  # noqa: E402

import afk_local as afk  # noqa: E402
from afk_local.integrations.dask import map_durable  # noqa: E402


def work(x: int, work_ms: float) -> int:
    """Spin for ``work_ms`` of CPU time (not sleep: the worker is busy), return ``x * x``."""
    end = time.thread_time() + work_ms / 1000
    while time.thread_time() < end:
        pass
    return x * x


@afk.durable
def square(ctx: afk.RunContext, item: list[float]) -> int:
    """``work`` inside one journaled step: the durable twin of the baseline."""
    x, work_ms = item
    return int(ctx.step("work", work, int(x), work_ms))


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return time.perf_counter() - start, out


def plain(client: Client, items: list[list[float]]) -> list[int]:
    futures = client.map(work, [int(x) for x, _ in items], work_ms=items[0][1], pure=False)
    return list(client.gather(futures))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--work-ms", type=float, nargs="+", default=[0.0, 10.0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where the stores go (default: a temp dir)")
    parser.add_argument(
        "--items-per-task",
        type=lambda v: None if v == "default" else int(v),
        nargs="+",
        default=[None, 1, 16],
        help="'default' (map_durable chooses) or a number of items per task",
    )
    args = parser.parse_args()

    rows = []
    with (
        tempfile.TemporaryDirectory(dir=args.dir, prefix="afk-bench-fanout-") as tmp,
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=None,
        ) as cluster,
        Client(cluster) as client,
    ):
        # warm up: workers import afk_local and unpickle the job once
        map_durable(square, [[0, 0.0]], store=Path(tmp) / "warm", client=client, progress=False)
        plain(client, [[0, 0.0]])
        for work_ms in args.work_ms:
            items = [[float(i), work_ms] for i in range(args.items)]
            expected = [i * i for i in range(args.items)]
            per_task = args.items_per_task
            base: list[float] = []
            first: dict[int | None, list[float]] = {k: [] for k in per_task}
            again: dict[int | None, list[float]] = {k: [] for k in per_task}
            for round_ in range(args.repeat):
                seconds, out = timed(plain, client, items)
                assert out == expected
                base.append(seconds)
                for k in per_task:
                    store = Path(tmp) / f"store-{work_ms}-{round_}-{k}"
                    for series in (first[k], again[k]):
                        seconds, out = timed(
                            map_durable,
                            square,
                            items,
                            store=store,
                            client=client,
                            progress=False,
                            items_per_task=k,
                        )
                        assert out == expected
                        series.append(seconds)
            b = statistics.median(base)
            rows.append([f"{work_ms:g}", "client.map (no checkpoints)", f"{b:.3f}", "1.00", "-"])
            for k in per_task:
                f, a = statistics.median(first[k]), statistics.median(again[k])
                extra_ms = (f - b) / args.items * 2 * 1000  # 2 workers run in parallel
                how = "map_durable" + (", default" if k is None else f", items_per_task={k}")
                rows += [
                    [
                        f"{work_ms:g}",
                        f"{how}, new runs",
                        f"{f:.3f}",
                        f"{f / b:.2f}",
                        f"{extra_ms:.1f}",
                    ],
                    [f"{work_ms:g}", f"{how}, runs completed", f"{a:.3f}", f"{a / b:.2f}", "-"],
                ]
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"{args.items} items, 2 worker processes x 1 thread, median of {args.repeat} rounds "
        f"(load average at the end: {load})"
    )
    print(table(["work ms/item", "how", "seconds", "x client.map", "ms/run added"], rows))


if __name__ == "__main__":
    main()
