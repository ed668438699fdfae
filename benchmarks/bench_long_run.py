"""A long run's sync checkpoints, packing included: does a checkpoint cost more as the run grows?

    python benchmarks/bench_long_run.py [--dir /dev/shm] [--checkpoints 20000]

One ``RunWriter`` writes ``--checkpoints`` sync checkpoints of bench_checkpoint_cpu.py's
~9 KB state into one run, and the format floor (bare os calls, one file per checkpoint,
no packing) writes the same states beside it, the two alternating. Every few hundred
checkpoints the writer folds its older loose files into a pack on the checkpoint that
triggers it (``pack_loose_limit``); the script times each of those packs. Prints both
totals, their ratio, how much of the writer's time went to packing, and the packs'
times at the start and at the end of the run: a pack that costs more as the run grows
shows there.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from bench_checkpoint_cpu import FormatFloor, Job

import afk_local as afk
from afk_local.storage.rundir.write import pack_trigger


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", default="/dev/shm", help="where to write (default: /dev/shm)")
    parser.add_argument("--checkpoints", type=int, default=20000)
    args = parser.parse_args()
    packs: list[float] = []
    pack_run = pack_trigger.pack_run

    def timed_pack_run(*a: Any, **k: Any) -> Any:
        started = time.perf_counter()
        try:
            return pack_run(*a, **k)
        finally:
            packs.append(time.perf_counter() - started)

    pack_trigger.pack_run = timed_pack_run  # type: ignore[assignment]
    base = Path(tempfile.mkdtemp(prefix="afk-bench-long-", dir=args.dir))
    try:
        floor = FormatFloor(base / "floor")
        run = afk.Store(base / "store").create("long")
        job, state = Job(1), {}
        spent = {"floor": 0.0, "writer": 0.0}
        clock = time.perf_counter
        for _ in range(args.checkpoints):
            job.advance(state)
            started = clock()
            floor.write(state)
            middle = clock()
            run.checkpoint("runtime_state", state, step=1)
            spent["floor"] += middle - started
            spent["writer"] += clock() - middle
        run.close()
        floor.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    n = args.checkpoints
    print(f"{n} sync checkpoints into one run in {args.dir}")
    print(f"format floor:         {spent['floor']:.2f} s ({spent['floor'] / n * 1e6:.0f} µs each)")
    each = spent["writer"] / n * 1e6
    print(f"RunWriter.checkpoint: {spent['writer']:.2f} s ({each:.0f} µs each)")
    print(f"writer / floor:       {spent['writer'] / spent['floor']:.2f}x")
    if packs:
        share = sum(packs) / spent["writer"]
        tenth = max(1, len(packs) // 10)
        first = statistics.median(packs[:tenth]) * 1000
        last = statistics.median(packs[-tenth:]) * 1000
        print(f"packs: {len(packs)}, {share:.0%} of the writer's time")
        print(f"pack median ms: first tenth {first:.1f}, last tenth {last:.1f}")


if __name__ == "__main__":
    main()
