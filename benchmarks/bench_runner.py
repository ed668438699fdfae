"""Overhead of the durable runner: per ctx.step and per ctx.checkpoint(), per durability mode.

    python benchmarks/bench_runner.py [--n 300] [--state-kb 10] [--dir /tmp]

A job mutates a ~10 KB state each iteration. Rows:
  no checkpointing     the same loop, plain Python (baseline for the loop itself)
  floor                atomic write of the same bytes: temp+fsync+rename+dir fsync (2 fsyncs)
  checkpoint() <mode>  ctx.checkpoint() per iteration in a durable job
  step <mode>          ctx.step(...) per iteration (journal intent+outcome: 2 fsyncs)
  SqliteSaver.put      LangGraph's SqliteSaver.put of the same state (WAL), when importable
Times are the median of --repeat runs, in microseconds per iteration, minus the plain loop;
ratios are against the floor measured in the same run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import statistics
import tempfile
import time
import uuid

import msgspec

import afk_local as afk
from afk_local.storage import fsio

try:
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.sqlite import SqliteSaver
except ImportError:  # the column is skipped
    SqliteSaver = None


def make_state(kb: int) -> dict:
    msgs = [
        {"role": "user" if i % 2 else "assistant", "content": f"message {i} " + "lorem ipsum " * 8}
        for i in range(kb * 10)
    ]
    return {"messages": msgs, "step": 0}


def mutate(state: dict, i: int) -> None:
    state["step"] = i
    state["messages"][i % len(state["messages"])]["content"] = (
        f"edited at {i} " + "lorem ipsum " * 8
    )


def time_loop(fn, n: int) -> float:
    t0 = time.perf_counter()
    fn(n)
    return (time.perf_counter() - t0) / n * 1e6


def bench_plain(n: int, kb: int) -> float:
    state = make_state(kb)

    def loop(n):
        for i in range(n):
            mutate(state, i)

    return time_loop(loop, n)


def bench_floor(n: int, kb: int, base: str) -> float:
    state = make_state(kb)
    d = tempfile.mkdtemp(dir=base)

    def loop(n):
        for i in range(n):
            mutate(state, i)
            fsio.atomic_write(os.path.join(d, "state.bin"), msgspec.msgpack.encode(state))

    try:
        return time_loop(loop, n)
    finally:
        shutil.rmtree(d)


def bench_job(n: int, kb: int, base: str, mode: str, what: str) -> float:
    root = tempfile.mkdtemp(dir=base)

    def body(ctx, n):
        ctx.state.update(make_state(kb))
        t0 = time.perf_counter()
        for i in range(n):
            mutate(ctx.state, i)
            if what == "checkpoint":
                ctx.checkpoint()
            else:
                ctx.step("work", int, i)
        ctx.writer.flush()  # async: the queue must be on disk before we stop the clock
        return (time.perf_counter() - t0) / n * 1e6

    body.__qualname__ = body.__name__ = f"bench_{mode}_{what}_{uuid.uuid4().hex[:6]}"
    job = afk.durable(store=root, durability=mode)(body)
    try:
        return job.run(n)
    finally:
        shutil.rmtree(root)


def bench_sqlite_saver(n: int, kb: int, base: str) -> tuple[float, str] | None:
    if SqliteSaver is None:
        return None
    d = tempfile.mkdtemp(dir=base)
    conn = sqlite3.connect(os.path.join(d, "lg.sqlite"), check_same_thread=False)
    saver = SqliteSaver(conn)
    saver.setup()
    sync = conn.execute("PRAGMA synchronous").fetchone()[0]
    state = make_state(kb)
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}

    def loop(n):
        cfg = config
        for i in range(n):
            mutate(state, i)
            ckpt = empty_checkpoint()
            ckpt["channel_values"] = {"state": state}
            cfg = saver.put(cfg, ckpt, {"source": "loop", "step": i}, {})

    try:
        return time_loop(loop, n), f"journal_mode=WAL synchronous={sync}"
    finally:
        conn.close()
        shutil.rmtree(d)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--state-kb", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = parser.parse_args()
    base = args.dir or tempfile.gettempdir()
    size = len(msgspec.msgpack.encode(make_state(args.state_kb)))
    # Every configuration runs once per round, rounds repeat: drift in machine load
    # (other processes, disk) spreads over all rows instead of biasing one.
    configs: list[tuple[str, object]] = [("plain", None), ("floor", None)]
    configs += [
        (f"{what} {mode}", (mode, what))
        for what in ("checkpoint", "step")
        for mode in ("sync", "async", "exit")
    ]
    configs.append(("sqlite", None))
    samples: dict[str, list[float]] = {name: [] for name, _ in configs}
    note = ""
    for _ in range(args.repeat):
        for name, spec in configs:
            if name == "plain":
                samples[name].append(bench_plain(args.n, args.state_kb))
            elif name == "floor":
                samples[name].append(bench_floor(args.n, args.state_kb, base))
            elif name == "sqlite":
                got = bench_sqlite_saver(args.n, args.state_kb, base)
                if got is not None:
                    samples[name].append(got[0])
                    note = got[1]
            else:
                mode, what = spec  # type: ignore[misc]
                samples[name].append(bench_job(args.n, args.state_kb, base, mode, what))
    plain = statistics.median(samples["plain"])
    floor = statistics.median(samples["floor"]) - plain
    rows: list[tuple[str, float, str]] = [("no checkpointing (loop only)", plain, "")]
    rows.append(("floor: atomic write, 2 fsyncs", floor, ""))
    for name, _ in configs[2:-1]:
        what, mode = name.split()
        label = f"{'checkpoint()' if what == 'checkpoint' else 'ctx.step'} {mode}"
        rows.append((label, statistics.median(samples[name]) - plain, ""))
    lg = None
    if samples["sqlite"]:
        lg = statistics.median(samples["sqlite"]) - plain
        rows.append(("LangGraph SqliteSaver.put", lg, note))
    print(f"state: {size} bytes msgpack, n={args.n}, repeat={args.repeat}, dir={base}")
    print(f"{'operation':34} {'us/op':>10} {'x floor':>8} {'x SqliteSaver':>14}  note")
    for name, us, note in rows:
        vs_floor = f"{us / floor:8.2f}" if floor > 0 and name != rows[0][0] else f"{'-':>8}"
        vs_lg = f"{us / lg:14.2f}" if lg else f"{'-':>14}"
        print(f"{name:34} {us:10.1f} {vs_floor} {vs_lg}  {note}")


if __name__ == "__main__":
    main()
