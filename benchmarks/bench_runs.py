"""What a run costs: fsyncs per run, tiny runs and steps against DBOS and LangGraph,
fan-out on Dask, and listing and sweeping a store of 100,000 runs.

    python benchmarks/bench_runs.py [--runs 100] [--steps 200] [--rounds 3]
        [--many 100000] [--many-dir /dev/shm] [--fanout-items 200] [--dir DIR]

Sections (each prints a table; ratios are against a baseline measured in the same run):

1. fsyncs of a new one-step ``sync`` run (``ctx.step`` once, then its result) and of
   ``Store.create``, counted through the I/O seam (a store's ``fsio.Env`` recorder), and
   with ``strace -c -f`` where strace is installed (a child making ``--runs`` runs,
   minus a child making none).
2. Tiny runs and steps, side by side, interleaved over ``--rounds``: a one-step run and a
   step inside one run, afk_local (sync) against DBOS on SQLite (``pip install
   afk_local[bench]``) and LangGraph's ``SqliteSaver`` (one thread per run, a one-node
   graph), each skipped when not installed.
3. ``map_durable`` against ``client.map`` on a 2-worker Dask cluster at 0 ms of work
   (``benchmarks/bench_fanout.py``; ``--fanout-items 0`` skips it).
4. A store of ``--many`` runs built in ``--many-dir`` (``benchmarks/many_runs.py``: real
   encodings, no fsyncs; ``--many 0`` skips it): ``afk-local runs --limit 50`` (a new
   process), ``Store.runs(limit=50)`` and the first ``Store.iter_runs()`` result in a new
   Store, ``Store.interrupted()``, the watcher's first sweep (a new Store, the index on
   disk) and its steady sweep, against issue 29's targets.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import table  # noqa: E402
from many_runs import build_store  # noqa: E402

import afk_local as afk  # noqa: E402
from afk_local.storage import fsio  # noqa: E402


def add_one(x: int) -> int:
    return x + 1


# -- 1. fsyncs ---------------------------------------------------------------------------


def seam_fsyncs(base: Path) -> tuple[int, int]:
    """fsyncs of one new one-step sync run, and of one Store.create, through the seam."""
    calls: list[fsio.IoCall] = []
    store = afk.Store(base / "seam", options=afk.StoreOptions(env=fsio.Env(recorder=calls.append)))

    @afk.durable(store=store, durability="sync")
    def one_step(ctx: afk.RunContext, x: int) -> int:
        return ctx.step("add", add_one, x)

    one_step.run(0)  # the store's own files
    calls.clear()
    one_step.run(1)
    per_run = sum(c.operation == "fsync" for c in calls)
    calls.clear()
    store.create().close()
    return per_run, sum(c.operation == "fsync" for c in calls)


STRACE_CHILD = """
import sys
import afk_local as afk
store = afk.Store(sys.argv[1])

@afk.durable(store=store, durability="sync")
def one_step(ctx, x):
    return ctx.step("add", lambda: x + 1)

one_step.run(0)
for i in range(int(sys.argv[2])):
    one_step.run(i)
"""


def strace_counts(base: Path, runs: int) -> dict[str, float] | None:
    """Per-run syscall counts (fsync, fdatasync, rename, symlink...) from ``strace -c -f``."""
    if shutil.which("strace") is None:
        return None

    def count(n: int, where: str) -> dict[str, int]:
        out = base / f"strace-{where}.txt"
        subprocess.run(
            [
                "strace", "-c", "-f", "-o", str(out),
                "-e", "trace=fsync,fdatasync,rename,renameat,renameat2,symlink,symlinkat,mkdirat",
                sys.executable, "-c", STRACE_CHILD, str(base / where), str(n),
            ],
            check=True, capture_output=True,
        )  # fmt: skip
        found: dict[str, int] = {}
        for line in out.read_text().splitlines():
            m = re.match(r"\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)$", line)
            if m:
                found[m.group(2)] = int(m.group(1))
        return found

    with_runs, without = count(runs, "strace-runs"), count(0, "strace-none")
    return {k: (with_runs.get(k, 0) - without.get(k, 0)) / runs for k in with_runs}


# -- 2. tiny runs and steps --------------------------------------------------------------


class AfkSide:
    name = "afk_local (sync)"

    def __init__(self, base: Path) -> None:
        store = afk.Store(base / "afk")

        @afk.durable(store=store, durability="sync")
        def one_step(ctx: afk.RunContext, x: int) -> int:
            return ctx.step("add", add_one, x)

        @afk.durable(store=store, durability="sync")
        def many_steps(ctx: afk.RunContext, n: int) -> int:
            return sum(ctx.step("add", add_one, i) for i in range(n))

        self.one_step, self.many_steps = one_step, many_steps
        one_step.run(0)

    def runs(self, n: int) -> float:
        t0 = time.perf_counter()
        for i in range(n):
            self.one_step.run(i)
        return (time.perf_counter() - t0) / n

    def steps(self, n: int) -> float:
        t0 = time.perf_counter()
        self.many_steps.run(n)
        return (time.perf_counter() - t0) / n


class DbosSide:
    name = "DBOS on SQLite"

    def __init__(self, base: Path) -> None:
        from dbos import DBOS  # noqa: PLC0415

        logging.getLogger("dbos").setLevel(logging.WARNING)
        self._dbos = DBOS
        DBOS(
            config={
                "name": "afk-bench",
                "system_database_url": f"sqlite:///{base / 'dbos.sqlite'}",
                "run_admin_server": False,
                "log_level": "WARNING",
            }
        )

        @DBOS.step()
        def add(x: int) -> int:
            return x + 1

        @DBOS.workflow()
        def one_step(x: int) -> int:
            return add(x)

        @DBOS.workflow()
        def many_steps(n: int) -> int:
            return sum(add(i) for i in range(n))

        self.one_step, self.many_steps = one_step, many_steps
        DBOS.launch()
        logging.getLogger("dbos").setLevel(logging.WARNING)
        one_step(0)

    def runs(self, n: int) -> float:
        t0 = time.perf_counter()
        for i in range(n):
            self.one_step(i)
        return (time.perf_counter() - t0) / n

    def steps(self, n: int) -> float:
        t0 = time.perf_counter()
        self.many_steps(n)
        return (time.perf_counter() - t0) / n

    def close(self) -> None:
        self._dbos.destroy()


class LangGraphSide:
    name = "LangGraph SqliteSaver"

    def __init__(self, base: Path) -> None:
        from typing import TypedDict  # noqa: PLC0415

        from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: PLC0415
        from langgraph.graph import END, START, StateGraph  # noqa: PLC0415

        class State(TypedDict):
            x: int

        graph = StateGraph(State)
        graph.add_node("add", lambda s: {"x": s["x"] + 1})
        graph.add_edge(START, "add")
        graph.add_edge("add", END)
        self._conn = sqlite3.connect(base / "langgraph.sqlite", check_same_thread=False)
        self.app = graph.compile(checkpointer=SqliteSaver(self._conn))
        self._thread = 0
        self.runs(1)

    def runs(self, n: int) -> float:
        t0 = time.perf_counter()
        for i in range(n):
            self._thread += 1
            self.app.invoke({"x": i}, {"configurable": {"thread_id": f"t{self._thread}"}})
        return (time.perf_counter() - t0) / n

    def steps(self, n: int) -> float | None:
        return None  # a step of a one-node graph is a run: see the runs row

    def close(self) -> None:
        self._conn.close()


def tiny(base: Path, runs: int, steps: int, rounds: int) -> list[list[Any]]:
    sides: list[Any] = [AfkSide(base)]
    for make in (DbosSide, LangGraphSide):
        try:
            sides.append(make(base))
        except ImportError as exc:
            print(f"({make.name} skipped: {exc})")
    run_times: dict[str, list[float]] = {s.name: [] for s in sides}
    step_times: dict[str, list[float]] = {s.name: [] for s in sides}
    for _ in range(rounds):
        for side in sides:
            run_times[side.name].append(side.runs(runs))
            per_step = side.steps(steps)
            if per_step is not None:
                step_times[side.name].append(per_step)
    for side in sides:
        with contextlib.suppress(Exception):
            getattr(side, "close", lambda: None)()
    afk_run = statistics.median(run_times[AfkSide.name])
    afk_step = statistics.median(step_times[AfkSide.name])
    rows = []
    for side in sides:
        r = statistics.median(run_times[side.name])
        s = statistics.median(step_times[side.name]) if step_times[side.name] else None
        rows.append(
            [
                side.name,
                f"{r * 1000:.2f}",
                f"{afk_run / r:.2f}",
                "-" if s is None else f"{s * 1000:.3f}",
                "-" if s is None else f"{afk_step / s:.2f}",
            ]
        )
    return rows


# -- 4. many runs ------------------------------------------------------------------------


def many(root: Path, count: int) -> list[list[Any]]:
    from afk_local.watcher.watcher import Watcher  # noqa: PLC0415

    t0 = time.perf_counter()
    build_store(root, count)
    print(f"built {count} runs in {time.perf_counter() - t0:.1f} s at {root}")
    afk.Store(root).interrupted()  # the index on disk, as any earlier listing leaves it

    def timed(fn: Any) -> float:
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t

    cli = [sys.executable, "-m", "afk_local", "--root", str(root), "runs", "--limit", "50"]
    empty = [sys.executable, "-c", "pass"]  # the interpreter's own start-up

    def in_process(fn: Any, repeat: int = 1) -> float:
        return statistics.median(timed(fn) for _ in range(repeat))

    process = in_process(lambda: subprocess.run(cli, check=True, capture_output=True), 3)
    start = in_process(lambda: subprocess.run(empty, check=True), 3)
    watcher = Watcher(afk.Store(root))
    limited = in_process(lambda: afk.Store(root).runs(limit=50))
    first = in_process(lambda: next(afk.Store(root).iter_runs()))
    interrupted = in_process(lambda: afk.Store(root).interrupted())
    rows: list[tuple[str, float, float | None, str]] = [
        ("afk-local runs --limit 50 (new process)", process, 0.3, f"python -c pass: {start:.3f} s"),
        ("Store.runs(limit=50), new Store", limited, 0.3, ""),
        ("first of Store.iter_runs(), new Store", first, None, ""),
        ("Store.interrupted(), new Store", interrupted, None, ""),
        ("watcher first sweep (index on disk)", in_process(watcher.interrupted), 3.0, ""),
        ("watcher steady sweep", in_process(watcher.interrupted, 3), 1.0, ""),
    ]
    out = []
    for what, seconds, goal, note in rows:
        ratio = "-" if goal is None else f"{seconds / goal:.2f}"
        out.append([what, f"{seconds:.3f}", "-" if goal is None else f"{goal:g}", ratio, note])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--many", type=int, default=100_000)
    parser.add_argument("--many-dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    parser.add_argument("--fanout-items", type=int, default=200)
    parser.add_argument("--dir", default=None, help="where the small stores go (default: temp)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(dir=args.dir, prefix="afk-bench-runs-") as tmp:
        base = Path(tmp)
        per_run, per_create = seam_fsyncs(base)
        rows: list[list[Any]] = [["one-step sync run", "I/O seam", per_run]]
        rows.append(["Store.create", "I/O seam", per_create])
        traced = strace_counts(base, args.runs) or {}
        rows += [
            ["one-step sync run", f"strace -c -f: {k}", f"{v:g}"]
            for k, v in traced.items()
            if k != "total"
        ]
        print("1. fsyncs and directory changes per run (issue 29 target: at most 6 fsyncs)")
        print(table(["what", "counted by", "per run"], rows))
        print()
        print(
            f"2. tiny runs ({args.runs} one-step runs) and steps ({args.steps} in one run), "
            f"median of {args.rounds} interleaved rounds "
            "(targets: runs <= 0.5x DBOS, steps <= 0.15x)"
        )
        headers = ["system", "ms/run", "afk_local / it", "ms/step", "afk_local / it"]
        print(table(headers, tiny(base, args.runs, args.steps, args.rounds)))
        print()
    if args.fanout_items:
        print("3. fan-out at 0 ms of work (targets: new runs <= 2x client.map, completed <= 1x)")
        command = [sys.executable, str(HERE / "bench_fanout.py"), "--items"]
        command += [str(args.fanout_items), "--work-ms", "0", "--repeat", str(args.rounds)]
        subprocess.run(command + (["--dir", args.dir] if args.dir else []), check=True)
        print()
    if args.many:
        with tempfile.TemporaryDirectory(dir=args.many_dir, prefix="afk-bench-many-") as tmp:
            print(f"4. a store of {args.many} runs ({tmp})")
            headers = ["what", "seconds", "target s", "x target", ""]
            print(table(headers, many(Path(tmp), args.many)))


if __name__ == "__main__":
    main()
