"""The CPU of one sync checkpoint: afk_local next to the format's floor and SqliteSaver.put.

    python benchmarks/bench_checkpoint_cpu.py [--dir /dev/shm] [--rounds 2000]
    python benchmarks/bench_checkpoint_cpu.py --profile save   # cProfile of one contender

On tmpfs (the default directory, /dev/shm) an fsync costs next to nothing, so what is
left is the CPU each contender spends on the caller's path: what a user with an NVMe
disk waits for. Every round writes the same ~9 KB state (one note changed per round)
once with each contender, in a shuffled order, in one process:

- format floor: the record as msgpack (msgspec) and zstd (level 3, one reused
  compressor), the header with its crc32, then with bare os calls: temp file, write,
  fsync, rename, ``latest`` symlink to a temp name renamed over ``latest``, one
  directory fsync (DESIGN's publish, docs/guarantees.md 1);
- ``RunWriter.checkpoint`` (sync);
- ``StateCheckpoint.save`` (sync);
- ``ctx.checkpoint()`` in a sync ``@durable`` job (the whole benchmark runs in its body);
- LangGraph's ``SqliteSaver.put`` (journal_mode=WAL, synchronous=FULL), when installed.

Prints the median µs per call and the ratios to the floor and to SqliteSaver.put, and the
mean CPU per call (which counts what only some calls pay: a writer packs its loose files
every few hundred checkpoints).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import random
import shutil
import sqlite3
import statistics
import struct
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import msgspec
import zstandard
from common import table, text

import afk_local as afk

try:
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.sqlite import SqliteSaver
except ImportError:  # the column is skipped
    SqliteSaver = None

_HEADER = struct.Struct("<4sBBQQ")


class Job:
    """A ~9 KB job state that changes a little at every step (as bench_write.py's)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.notes = [text(self.rng, 400) for _ in range(22)]
        self.step = 0

    def advance(self, state: dict[str, object]) -> None:
        self.step += 1
        self.notes[self.step % len(self.notes)] = text(self.rng, 400)
        state.update(step=self.step, done=self.step * 7, notes=list(self.notes))


class FormatFloor:
    """The format's own floor: encode, compress, frame, publish with bare os calls."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir()
        self.dir = str(directory)
        self.dir_fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.cctx = zstandard.ZstdCompressor(level=3, write_checksum=True)
        self.seq = 0
        self.pid = os.getpid()

    def write(self, state: dict[str, object]) -> None:
        self.seq += 1
        record = {"seq": self.seq, "phase": "runtime_state", "payload": state}
        body = self.cctx.compress(msgspec.msgpack.encode(record))
        head = _HEADER.pack(b"AFK1", 1, 0, 0, len(body))
        frame = head + struct.pack("<I", zlib.crc32(body, zlib.crc32(head))) + body
        name = f"{self.seq:012d}.runtime_state.ckpt"
        tmp = f"{self.dir}/.tmp-{name}.{self.pid}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(tmp, flags, 0o600)
        os.write(fd, frame)
        os.fsync(fd)
        os.close(fd)
        os.replace(tmp, f"{self.dir}/{name}")
        link = f"{self.dir}/.tmp-latest.{self.pid}"
        os.symlink(name, link)
        os.replace(link, f"{self.dir}/latest")
        os.fsync(self.dir_fd)

    def close(self) -> None:
        os.close(self.dir_fd)


class Sqlite:
    """LangGraph's SqliteSaver, WAL and synchronous=FULL, one put per call."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir()
        self.conn = sqlite3.connect(directory / "lg.sqlite", check_same_thread=False)
        self.saver = SqliteSaver(self.conn)
        self.saver.setup()
        self.conn.execute("PRAGMA synchronous=FULL")
        mode = self.conn.execute("PRAGMA journal_mode").fetchone()[0]
        sync = self.conn.execute("PRAGMA synchronous").fetchone()[0]
        self.note = f"journal_mode={mode} synchronous={sync}"
        self.config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        self.step = 0

    def write(self, state: dict[str, object]) -> None:
        self.step += 1
        ckpt = empty_checkpoint()
        ckpt["channel_values"] = {"state": state}
        self.config = self.saver.put(self.config, ckpt, {"source": "loop", "step": self.step}, {})

    def close(self) -> None:
        self.conn.close()


def measure(
    base: Path, rounds: int, profile: str | None
) -> tuple[dict[str, float], dict[str, float], dict[str, float], str]:
    """Run every contender ``rounds`` times, interleaved, inside a durable job's body.

    Returns the median wall-clock µs per call, the median CPU µs of the process per call
    (every thread: a background thread's work counts), the mean CPU µs per call (with
    what only some calls pay, such as packing), and SqliteSaver's settings.
    """
    job_state = Job(1)
    cpu: dict[str, list[float]] = {}
    floor = FormatFloor(base / "floor")
    store = afk.Store(base / "store")
    run = store.create("bench")
    saved = afk.StateCheckpoint(base / "state-checkpoint")
    sqlite = Sqlite(base / "sqlite") if SqliteSaver is not None else None

    def body(ctx: afk.RunContext) -> tuple[dict[str, list[float]], str]:
        state = ctx.state
        contenders: list[tuple[str, Callable[[], object]]] = [
            ("format floor", lambda: floor.write(state)),
            ("RunWriter.checkpoint", lambda: run.checkpoint("runtime_state", state, step=1)),
            ("StateCheckpoint.save", lambda: saved.save(state)),
            ("ctx.checkpoint()", ctx.checkpoint),
        ]
        if sqlite is not None:
            contenders.append(("SqliteSaver.put", lambda: sqlite.write(state)))
        samples: dict[str, list[float]] = {name: [] for name, _ in contenders}
        cpu.update({name: [] for name, _ in contenders})
        for _ in range(20):  # warm up: first keyframes, prefetch thread, sqlite pages
            job_state.advance(state)
            for _, fn in contenders:
                fn()
        if profile is not None:
            fn = dict(contenders)[profile]
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(rounds):
                job_state.advance(state)
                fn()
            profiler.disable()
            stats = pstats.Stats(profiler)
            stats.sort_stats("tottime").print_stats(os.environ.get("BENCH_PROFILE_FILTER", ""), 25)
            stats.sort_stats("cumulative").print_stats(40)
            return samples, ""
        clock, cpu_clock = time.perf_counter_ns, time.process_time_ns
        # A new order every round: what runs first pays for caches the one before it
        # evicted (the floor's zstd tables are larger than the L2), so no contender may
        # always follow the same one, as a rotation would have it.
        order = random.Random(0)
        for _ in range(rounds):
            job_state.advance(state)
            for name, fn in order.sample(contenders, len(contenders)):
                started, cpu_started = clock(), cpu_clock()
                fn()
                samples[name].append((clock() - started) / 1000)
                cpu[name].append((cpu_clock() - cpu_started) / 1000)
        return samples, sqlite.note if sqlite is not None else ""

    body.__qualname__ = body.__name__ = "bench_checkpoint_cpu_job"
    job = afk.durable(store=base / "jobs", durability="sync")(body)
    try:
        samples, note = job.run()
    finally:
        run.close()
        saved.close()
        floor.close()
        if sqlite is not None:
            sqlite.close()
    wall = {name: statistics.median(v) for name, v in samples.items() if v}
    mean_cpu = {name: statistics.fmean(v) for name, v in cpu.items() if v}
    return wall, {name: statistics.median(v) for name, v in cpu.items() if v}, mean_cpu, note


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", default="/dev/shm", help="where to write (default: /dev/shm)")
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument(
        "--profile",
        choices=["floor", "checkpoint", "save", "ctx", "sqlite"],
        help="print a cProfile of one contender instead of the table",
    )
    args = parser.parse_args()
    names = {
        "floor": "format floor",
        "checkpoint": "RunWriter.checkpoint",
        "save": "StateCheckpoint.save",
        "ctx": "ctx.checkpoint()",
        "sqlite": "SqliteSaver.put",
    }
    base = Path(tempfile.mkdtemp(prefix="afk-bench-cpu-", dir=args.dir))
    try:
        med, cpu, mean_cpu, note = measure(base, args.rounds, names.get(args.profile or ""))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if args.profile:
        return
    floor, cpu_floor = med["format floor"], cpu["format floor"]
    lg, cpu_lg = med.get("SqliteSaver.put"), cpu.get("SqliteSaver.put")
    mean_lg = mean_cpu.get("SqliteSaver.put")
    rows = [
        [
            name,
            f"{us:.0f}",
            f"{us / floor:.2f}x",
            f"{us / lg:.2f}x" if lg else "-",
            f"{cpu[name]:.0f}",
            f"{cpu[name] / cpu_floor:.2f}x",
            f"{cpu[name] / cpu_lg:.2f}x" if cpu_lg else "-",
            f"{mean_cpu[name]:.0f}",
            f"{mean_cpu[name] / mean_lg:.2f}x" if mean_lg else "-",
        ]
        for name, us in med.items()
    ]
    sqlite_note = note or "not installed"
    print(f"{args.rounds} interleaved rounds in {args.dir}; SqliteSaver: {sqlite_note}\n")
    headers = ["per call", "median µs", "x floor", "x SqliteSaver", "CPU µs", "x floor", "x Sqlite"]
    headers += ["mean CPU µs", "x Sqlite"]
    print(table(headers, rows))


if __name__ == "__main__":
    main()
