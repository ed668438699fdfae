"""Watcher: time from a run's death to its next checkpoint; sweep time over 10 000 runs.

    python benchmarks/bench_watcher.py [--dir DIR] [--kills 20] [--interval 0.5] [--runs 10000]

Death -> next checkpoint: a durable job checkpoints every 50 ms; it is SIGKILLed
``--kills`` times. With ``afk-local watch --interval S`` running, we measure from
the kill to the first checkpoint file the resumed process writes (``run_started``)
and to its first ``runtime_state``. The baseline, in the same run, is a person
typing ``afk-local resume RUN`` the instant the process died: the child's start
and resume alone, with no detection delay. The difference is what watching costs.

Sweep: a store of ``--runs`` runs (1% interrupted, the rest completed) is built
directly from encoded ``run.meta`` files without fsync (a fixture). We time
``Watcher.interrupted()`` cold (every meta decoded) and warm (metas unchanged
since the last sweep: one stat each), against ``Store.interrupted()`` and the
floor of listing the runs and stat-ing each ``run.meta``.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import table  # noqa: E402

import afk_local as afk  # noqa: E402
from afk_local.storage.format import codec  # noqa: E402
from afk_local.storage.format.layout import scan_checkpoints  # noqa: E402
from afk_local.storage.format.records import RunMeta, RunStatus  # noqa: E402
from afk_local.storage.store import Store  # noqa: E402
from afk_local.watcher.watcher import Watcher  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}


@afk.durable
def ticker(ctx: afk.RunContext, n: int = 1_000_000) -> int:
    """Checkpoints every 50 ms, forever (for the benchmark)."""
    for _ in ctx.iterate(range(n), progress=False):
        time.sleep(0.05)
    return n


def _owner_pid(store: Store, run_id: str, timeout: float = 30.0) -> int:
    """The pid of the live process owning the run (after it wrote a runtime_state)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if store.owner_alive(run_id):
            meta = store.read_meta(run_id)
            files = scan_checkpoints(store.paths(run_id).dir)
            if meta.owner is not None and files and files[-1].phase == "runtime_state":
                return meta.owner.pid
        time.sleep(0.01)
    raise TimeoutError(f"run {run_id} has no live owner")


def _wait_next(store: Store, run_id: str, after: int, t0: float) -> tuple[float, float]:
    """Seconds from t0 to the first checkpoint with seq > after, and to the first runtime_state."""
    first = None
    deadline = t0 + 60
    while time.monotonic() < deadline:
        newer = [f for f in scan_checkpoints(store.paths(run_id).dir) if f.seq > after]
        now = time.monotonic()
        if newer and first is None:
            first = now - t0
        if any(f.phase == "runtime_state" for f in newer):
            return first if first is not None else now - t0, now - t0
        time.sleep(0.002)
    raise TimeoutError(f"run {run_id}: no new checkpoint within 60 s")


def _start_ticker(store: Store) -> subprocess.Popen[bytes]:
    code = f"import bench_watcher as b; b.ticker.with_store({str(store.root)!r}).run(run_id='t')"
    return subprocess.Popen(
        [sys.executable, "-c", code],
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _dead(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True


def _kill_once(store: Store, run_id: str) -> tuple[int, float]:
    """SIGKILL the owner; returns the last seq it wrote and the kill time.

    The seq is read once the process is dead: a checkpoint it published between
    our look and the signal must not count as the resumed process's.
    """
    pid = _owner_pid(store, run_id)
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    while not _dead(pid):
        time.sleep(0.0005)
    after = scan_checkpoints(store.paths(run_id).dir)[-1].seq
    return after, t0


def death_to_checkpoint(base: Path, kills: int, interval: float) -> dict[str, list[float]]:
    """Kill the owner ``kills`` times under a watcher, then ``kills`` times resuming by hand."""
    results: dict[str, list[float]] = {}
    # baseline: resume by hand the instant the owner died
    store = Store(base / "manual")
    first = _start_ticker(store)
    manual_any, manual_state, children = [], [], [first]
    for _ in range(kills):
        after, t0 = _kill_once(store, "t")
        children.append(
            subprocess.Popen(
                [sys.executable, "-m", "afk_local", "resume", "t", "--root", str(store.root)],
                env=ENV,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        a, s = _wait_next(store, "t", after, t0)
        manual_any.append(a)
        manual_state.append(s)
    pid = _owner_pid(store, "t")
    os.kill(pid, signal.SIGKILL)
    for child in children:
        child.wait(timeout=60)
    results["resume by hand: run_started"] = manual_any
    results["resume by hand: runtime_state"] = manual_state

    store = Store(base / "watched")
    first = _start_ticker(store)
    watcher = subprocess.Popen(
        [sys.executable, "-m", "afk_local", "watch", "--root", str(store.root),
         "--interval", str(interval), "--max-attempts", "1000", "--json"],
        env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    watched_any, watched_state = [], []
    try:
        for _ in range(kills):
            after, t0 = _kill_once(store, "t")
            a, s = _wait_next(store, "t", after, t0)
            watched_any.append(a)
            watched_state.append(s)
    finally:
        watcher.send_signal(signal.SIGTERM)
        watcher.wait(timeout=60)
        first.wait(timeout=60)
    results[f"watch --interval {interval:g}: run_started"] = watched_any
    results[f"watch --interval {interval:g}: runtime_state"] = watched_state
    return results


def build_store(root: Path, n: int) -> Store:
    """``n`` runs, 1% running (interrupted: lock free), the rest completed; no fsync."""
    store = Store(root)
    runs = root / "runs"
    runs.mkdir(parents=True)
    stamp = 1_700_000_000_000
    for i in range(n):
        rid = f"run-{i:06d}"
        status = RunStatus.RUNNING if i % 100 == 0 else RunStatus.COMPLETED
        meta = RunMeta(
            run_id=rid,
            status=status,
            created_ms=stamp,
            updated_ms=stamp,
            entrypoint="bench_watcher:ticker",
            params={"args": [], "kwargs": {}},
        )
        d = runs / rid
        d.mkdir(mode=0o700)
        (d / "run.meta").write_bytes(codec.encode_meta(store.codec, meta))
        (d / "owner.lock").touch(mode=0o600)
    return store


def sweep_times(base: Path, n: int, repeat: int = 5) -> list[tuple[str, float, int]]:
    """Seconds per sweep over ``n`` runs, best of ``repeat``."""
    store = build_store(base / "big", n)

    def best(fn) -> tuple[float, int]:  # type: ignore[no-untyped-def]
        times, found = [], 0
        for _ in range(repeat):
            t = time.perf_counter()
            found = len(fn())
            times.append(time.perf_counter() - t)
        return min(times), found

    def floor() -> list[str]:
        out = []
        for rid in store.run_ids():
            os.stat(store.paths(rid).meta)
            out.append(rid)
        return out

    rows = []
    t, k = best(floor)
    rows.append(("floor: list runs + stat each run.meta", t, k))
    t, k = best(store.interrupted)
    rows.append(("Store.interrupted() (decode every meta)", t, k))
    cold = []
    for _ in range(repeat):
        w = Watcher(store)
        t0 = time.perf_counter()
        found = len(w.interrupted())
        cold.append(time.perf_counter() - t0)
    rows.append(("Watcher sweep, cold (first sweep)", min(cold), found))
    w = Watcher(store)
    w.interrupted()
    t, k = best(w.interrupted)
    rows.append(("Watcher sweep, warm (timer sweeps)", t, k))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", help="where to build the stores (default: a temp dir)")
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--runs", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-watcher-") as tmp:
        base = Path(tmp)
        lat = death_to_checkpoint(base, args.kills, args.interval)
        baseline = statistics.median(lat["resume by hand: runtime_state"])
        rows = []
        for name, values in lat.items():
            med = statistics.median(values)
            rows.append([
                name, f"{med * 1000:.0f}", f"{min(values) * 1000:.0f}",
                f"{max(values) * 1000:.0f}", f"{med / baseline:.2f}x",
            ])  # fmt: skip
        print(f"death -> next checkpoint, {args.kills} SIGKILLs each (ms)")
        print(table(["", "median", "min", "max", "vs by hand"], rows))
        print()
        sweep = sweep_times(base, args.runs)
        floor = sweep[0][1]
        print(f"sweep of {args.runs} runs ({args.runs // 100} interrupted), best of 5")
        print(
            table(
                ["", "ms", "runs found", "vs floor"],
                [[n, f"{t * 1000:.1f}", k, f"{t / floor:.1f}x"] for n, t, k in sweep],
            )
        )


if __name__ == "__main__":
    main()
