"""Packs: files and allocated bytes of finished sync runs, before and after ``pack``.

Run: python benchmarks/bench_pack.py [--dir DIR] [--sizes 100 1000 10000] [--reads 300]

A sync job over N items (``ctx.iterate``: one ``runtime_state`` checkpoint per item,
plus ``run_started`` and ``run_terminal``) is written three ways, each next to the
others in the same run and on the same disk:

- loose: one file per checkpoint (``Store(pack_loose_limit=None)``, afk_local before packs);
- live: the writer packing by itself past 256 loose files (the default);
- packed: the loose run after ``Store.pack()`` (``afk-local pack``).

For each: the run directory's files (besides ``effects.log``, which this job does not
have) and their allocated size (``du``: st_blocks), against the run's data bytes as
``afk-local`` reports them (the sum of its files' sizes). Then reads by seq: a fresh
``Store(...).open(run).get(seq)`` for random seqs (a new reader each time: no cache),
three rounds: the median and p99 of every read, and the slowest seq's best read (what
reading that checkpoint costs, without the preemptions a shared machine adds).

The fixtures are written with fsync turned off (fixture only: it changes when bytes
reach the disk, not which files or bytes there are); ``pack`` itself runs with fsync.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from common import no_fsync, table

import afk_local as afk


@afk.durable(durability="sync")
def items_job(ctx: afk.RunContext, n: int) -> int:
    """A job over ``n`` items: a small state checkpointed after each one."""
    ctx.state.setdefault("done", 0)
    for _ in ctx.iterate(range(n), progress=False):
        ctx.state["done"] += 1
    return int(ctx.state["done"])


def run_files(store: afk.Store, run_id: str) -> tuple[int, int, int]:
    """Files besides effects.log, their bytes (what afk-local reports), allocated bytes."""
    files = [
        p for p in store.paths(run_id).dir.iterdir() if p.name != "effects.log" and not p.is_dir()
    ]
    stats = [p.lstat() for p in files]
    return len(files), sum(s.st_size for s in stats), sum(s.st_blocks * 512 for s in stats)


def build(root: Path, n: int, limit: int | None) -> afk.Store:
    store = afk.Store(root, pack_loose_limit=limit)
    with no_fsync():
        assert items_job.with_store(store).run(n, run_id="job") == n
    return store


def read_times(root: Path, seqs: list[int]) -> list[float]:
    """Microseconds of a cold read of each seq: a new Store and reader every time."""
    samples = []
    for seq in seqs:
        start = time.perf_counter_ns()
        afk.Store(root).open("job").get(seq)
        samples.append((time.perf_counter_ns() - start) / 1000)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", help="where to write (a real disk; default: a temp dir)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10_000])
    parser.add_argument("--reads", type=int, default=300, help="random seqs read per run")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="afk-bench-pack-", dir=args.dir))
    rng = random.Random(18)
    layout_rows, read_rows, pack_rows = [], [], []
    try:
        for n in args.sizes:
            loose = build(base / f"loose-{n}", n, None)
            live = build(base / f"live-{n}", n, 256)
            files_l, data_l, du_l = run_files(loose, "job")
            files_v, data_v, du_v = run_files(live, "job")
            packed_root = base / f"packed-{n}"
            shutil.copytree(base / f"loose-{n}", packed_root, symlinks=True)
            packed = afk.Store(packed_root)
            start = time.perf_counter()
            (report,) = packed.pack(["job"])
            pack_s = time.perf_counter() - start
            assert not report.errors, report.errors
            files_p, data_p, du_p = run_files(packed, "job")
            for name, files, data, du in (
                ("loose (one file per checkpoint)", files_l, data_l, du_l),
                ("live writer (packs past 256 loose)", files_v, data_v, du_v),
                ("after `pack`", files_p, data_p, du_p),
            ):
                layout_rows.append(
                    [
                        f"{n:,}",
                        name,
                        f"{files:,}",
                        f"{data:,}",
                        f"{du:,}",
                        f"{du / data_l:.2f}x",
                        f"{files / files_l:.4f}x",
                    ]
                )
            pack_rows.append([f"{n:,}", f"{report.packed_files:,}", f"{pack_s * 1000:.0f}"])
            last = n + 2
            seqs = [rng.randint(1, last) for _ in range(args.reads)]
            # Interleave the two so disk and CPU noise hit both alike; three rounds, so
            # each seq's best time says what reading it costs and the others show noise.
            loose_t: dict[int, list[float]] = {}
            packed_t: dict[int, list[float]] = {}
            for _ in range(3):
                for seq in seqs:
                    loose_t.setdefault(seq, []).append(read_times(base / f"loose-{n}", [seq])[0])
                    packed_t.setdefault(seq, []).append(read_times(packed_root, [seq])[0])
            every_l = sorted(x for v in loose_t.values() for x in v)
            every_p = sorted(x for v in packed_t.values() for x in v)
            read_rows.append(
                [
                    f"{n:,}",
                    f"{statistics.median(every_l):.0f}",
                    f"{statistics.median(every_p):.0f}",
                    f"{every_p[int(0.99 * (len(every_p) - 1))]:.0f}",
                    f"{max(min(v) for v in packed_t.values()):.0f}",
                    f"{statistics.median(every_p) / statistics.median(every_l):.2f}x",
                ]
            )
        print("## Files and allocated bytes of a finished sync job over N items\n")
        print(
            "(data = the sum of the run's file sizes, what `afk-local` reports, of the loose run;"
            " ratios against the loose run)\n"
        )
        print(
            table(
                ["N items", "run", "files", "data B", "du B", "du / data", "files vs loose"],
                layout_rows,
            )
        )
        print("\n## `pack` of the finished loose run (with fsync)\n")
        print(table(["N items", "files packed", "ms"], pack_rows))
        print(
            f"\n## Read one checkpoint by seq, cold reader "
            f"({args.reads} random seqs x 3 rounds, µs)\n"
        )
        print(
            table(
                [
                    "N items",
                    "loose p50",
                    "packed p50",
                    "packed p99",
                    "packed: slowest seq, best of 3",
                    "packed/loose p50",
                ],
                read_rows,
            )
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
