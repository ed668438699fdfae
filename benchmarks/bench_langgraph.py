"""LangGraph checkpointers: ``put`` latency and bytes on disk, AfkLocalSaver vs SqliteSaver.

    python benchmarks/bench_langgraph.py [--dir DIR] [--steps 500] [--message-bytes 500]

A 500-step growing conversation (LangChain ``HumanMessage``/``AIMessage``, ~500 B
each, one new message per step), written the way a LangGraph chat loop writes it:
per step one ``put_writes`` (the new message, from one task) and one ``put`` of
the full checkpoint (every message so far in ``channel_values``, as LangGraph does
for a plain ``messages`` channel), parented on the previous checkpoint.

Both savers are durable and see the same data, interleaved step by step so disk
noise hits both alike:

- AfkLocalSaver: every ``put`` is an fsynced AFK1 file (zstd, delta against the
  previous checkpoint) + rename + directory fsync; ``put_writes`` is an fsynced append.
- SqliteSaver (langgraph-checkpoint-sqlite): ``setup()`` sets ``journal_mode=WAL``;
  ``synchronous=FULL`` is set explicitly (it is also SQLite's default); the
  pragmas in force are read back and printed. Every call is one committed
  transaction (an fsync of the WAL).

Reported: put latency (p50, p95, mean), put_writes p50, bytes on disk at the end
(AfkLocalSaver: every file of the store; SQLite: db + -wal + -shm), the time to
fetch the latest checkpoint from a freshly opened saver in this process (a resume;
median of interleaved rounds), and the same from a fresh Python process (imports
included, interleaved with a process that only imports LangGraph's checkpoint base),
with ratios against SqliteSaver measured in the same run; each child also times itself
from just after LangGraph's checkpoint imports to the newest checkpoint (the saver's
own imports and first ``get_tuple``, free of interpreter start-up noise).
"""

from __future__ import annotations

import argparse
import gc
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import conversation_step, table
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.sqlite import SqliteSaver

from afk_local.integrations.langgraph import AfkLocalSaver

THREAD = "bench-chat"


def dir_bytes(path: Path) -> int:
    """Bytes of every file under ``path`` (symlinks counted by their own size)."""
    return sum(p.lstat().st_size for p in path.rglob("*") if not p.is_dir())


def open_sqlite(path: Path) -> tuple[SqliteSaver, sqlite3.Connection, dict[str, Any]]:
    conn = sqlite3.connect(str(path), check_same_thread=False)
    saver = SqliteSaver(conn)
    saver.setup()  # journal_mode=WAL and the tables
    conn.execute("PRAGMA synchronous=FULL")
    pragmas = {
        "journal_mode": conn.execute("PRAGMA journal_mode").fetchone()[0],
        "synchronous": {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}[
            conn.execute("PRAGMA synchronous").fetchone()[0]
        ],
        "wal_autocheckpoint": conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0],
    }
    return saver, conn, pragmas


def timed(fn: Any, *args: Any) -> tuple[float, Any]:
    start = time.perf_counter_ns()
    result = fn(*args)
    return (time.perf_counter_ns() - start) / 1e6, result


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


_PROCESS = {
    "imports only": (
        "import langgraph.checkpoint.base, langgraph.checkpoint.serde.jsonplus",
        "pass",
    ),
    "AfkLocalSaver": (
        "from afk_local.integrations.langgraph import AfkLocalSaver",
        "t = AfkLocalSaver(ROOT).get_tuple(CONFIG)\n"
        "assert len(t.checkpoint['channel_values']['messages']) == STEPS",
    ),
    "SqliteSaver": (
        "import sqlite3\nfrom langgraph.checkpoint.sqlite import SqliteSaver",
        "conn = sqlite3.connect(DB, check_same_thread=False)\n"
        "t = SqliteSaver(conn).get_tuple(CONFIG)\n"
        "assert len(t.checkpoint['channel_values']['messages']) == STEPS",
    ),
}
"""Per saver: its imports, then reading the newest checkpoint with a new saver."""


# Each child times itself from just after LangGraph's checkpoint imports (which every
# saver pays) to the newest checkpoint in hand, in two parts: the saver's own imports
# (sqlite3 included for SQLite), then its first get_tuple. That leaves out the
# interpreter start-up and LangGraph's imports, whose noise (tens of ms on a busy VM)
# swamps the difference of two wall-clock medians.
_CHILD = (
    "import time\n"
    "import langgraph.checkpoint.base, langgraph.checkpoint.serde.jsonplus\n"
    "_t0 = time.perf_counter()\n"
    "{imports}\n"
    "_t1 = time.perf_counter()\n"
    "{read}\n"
    "_t2 = time.perf_counter()\n"
    "print((_t1 - _t0) * 1e3, (_t2 - _t1) * 1e3)\n"
)


def fresh_process_times(
    afk_root: Path, db: Path, rounds: int
) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
    """Median wall time of a new interpreter that imports a saver and gets the newest
    checkpoint, each saver's run interleaved with the other's and with imports only;
    and the medians of what each child measured after LangGraph's imports: the saver's
    imports, and its first get_tuple."""
    config = {"configurable": {"thread_id": THREAD, "checkpoint_ns": ""}}
    samples: dict[str, list[float]] = {name: [] for name in _PROCESS}
    inside: dict[str, list[tuple[float, float]]] = {name: [] for name in _PROCESS}
    steps = None
    for _ in range(rounds):
        for name, (imports, read) in _PROCESS.items():
            if steps is None:
                with AfkLocalSaver(afk_root) as saver:
                    steps = len(saver.get_tuple(config).checkpoint["channel_values"]["messages"])
            script = (
                f"ROOT, DB, STEPS = {str(afk_root)!r}, {str(db)!r}, {steps}\n"
                f"CONFIG = {config!r}\n" + _CHILD.format(imports=imports, read=read)
            )
            start = time.perf_counter_ns()
            done = subprocess.run(
                [sys.executable, "-c", script], check=True, capture_output=True, text=True
            )
            samples[name].append((time.perf_counter_ns() - start) / 1e6)
            imported, first = done.stdout.split()[-2:]
            inside[name].append((float(imported), float(first)))
    return (
        {name: statistics.median(v) for name, v in samples.items()},
        {
            name: (
                statistics.median(i for i, _ in v),
                statistics.median(f for _, f in v),
            )
            for name, v in inside.items()
        },
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", type=Path, default=None, help="where to write (a real disk)")
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--message-bytes", type=int, default=500)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--cold-rounds", type=int, default=7, help="fresh-saver reads")
    parser.add_argument("--process-rounds", type=int, default=11, help="fresh processes each")
    args = parser.parse_args()

    base = Path(tempfile.mkdtemp(prefix="bench-langgraph-", dir=args.dir))
    afk_root, sqlite_path = base / "afk", base / "checkpoints.sqlite"
    afk_saver = AfkLocalSaver(afk_root)
    sqlite_saver, conn, pragmas = open_sqlite(sqlite_path)
    savers: dict[str, Any] = {"AfkLocalSaver": afk_saver, "SqliteSaver": sqlite_saver}
    put_ms: dict[str, list[float]] = {name: [] for name in savers}
    writes_ms: dict[str, list[float]] = {name: [] for name in savers}
    parents: dict[str, Any] = dict.fromkeys(savers)

    rng = random.Random(args.seed)
    plain: list[dict[str, str]] = []
    messages: list[Any] = []
    serialized = 0
    for step in range(args.steps):
        conversation_step(rng, plain, args.message_bytes)
        last = plain[-1]
        kind = HumanMessage if last["role"] == "user" else AIMessage
        message = kind(content=last["content"], id=f"msg-{step}")
        messages.append(message)
        checkpoint = empty_checkpoint()
        checkpoint["id"] = str(uuid6(clock_seq=step))
        checkpoint["channel_values"] = {"messages": list(messages)}
        checkpoint["channel_versions"] = {"messages": afk_saver.get_next_version(step, None)}
        new_versions = dict(checkpoint["channel_versions"])
        metadata: Any = {"source": "loop", "step": step, "parents": {}}
        serialized += len(afk_saver.serde.dumps_typed(checkpoint)[1])
        for name, saver in savers.items():
            conf: dict[str, Any] = {"thread_id": THREAD, "checkpoint_ns": ""}
            if parents[name] is not None:
                conf["checkpoint_id"] = parents[name]
                ms, _ = timed(
                    saver.put_writes,
                    {"configurable": conf},
                    [("messages", [message])],
                    f"task-{step}",
                )
                writes_ms[name].append(ms)
            ms, new_config = timed(
                saver.put, {"configurable": conf}, checkpoint, metadata, new_versions
            )
            put_ms[name].append(ms)
            parents[name] = new_config["configurable"]["checkpoint_id"]

    afk_saver.close()
    conn.close()
    size = {"AfkLocalSaver": dir_bytes(afk_root), "SqliteSaver": 0}
    for suffix in ("", "-wal", "-shm"):
        candidate = Path(str(sqlite_path) + suffix)
        if candidate.exists():
            size["SqliteSaver"] += candidate.stat().st_size

    # Resume: a fresh saver fetches the newest checkpoint (AfkLocalSaver reads its files),
    # interleaved with SQLite's, several rounds; median.
    latest = {"configurable": {"thread_id": THREAD, "checkpoint_ns": ""}}
    cold: dict[str, list[float]] = {name: [] for name in savers}
    # Each read starts from a collected heap (gc.collect() first): otherwise whichever
    # reader happens to cross the collector's threshold pays for collecting what the
    # benchmark allocated before it (the 500 checkpoints it wrote, the other reader's).
    warm_ms = 0.0
    for round_no in range(args.cold_rounds):
        for name in ("AfkLocalSaver", "SqliteSaver")[:: 1 if round_no % 2 else -1]:
            if name == "AfkLocalSaver":
                fresh = AfkLocalSaver(afk_root)
                gc.collect()
                ms, tup = timed(fresh.get_tuple, latest)
                warm_ms, _ = timed(fresh.get_tuple, latest)
                fresh.close()
            else:
                fresh_sqlite, conn, _ = open_sqlite(sqlite_path)
                gc.collect()
                ms, tup = timed(fresh_sqlite.get_tuple, latest)
                conn.close()
            cold[name].append(ms)
            assert len(tup.checkpoint["channel_values"]["messages"]) == args.steps
            del tup
    resume_ms = {name: statistics.median(samples) for name, samples in cold.items()}
    process_ms, after_imports_ms = fresh_process_times(afk_root, sqlite_path, args.process_rounds)

    base_name = "SqliteSaver"
    rows = []
    for name in savers:
        p50 = statistics.median(put_ms[name])
        rows.append(
            [
                name,
                f"{p50:.2f}",
                f"{percentile(put_ms[name], 0.95):.2f}",
                f"{statistics.fmean(put_ms[name]):.2f}",
                f"{statistics.fmean(put_ms[name]) / statistics.fmean(put_ms[base_name]):.2f}x",
                f"{statistics.median(writes_ms[name]):.2f}",
                f"{size[name] / 1e6:.2f} MB",
                f"{size[name] / size[base_name]:.3f}x",
                f"{resume_ms[name]:.1f}",
            ]
        )
    print(
        f"\n## LangGraph savers: {args.steps}-step growing conversation "
        f"(~{args.message_bytes} B per message), both durable\n"
    )
    print(
        table(
            [
                "saver",
                "put p50 ms",
                "put p95 ms",
                "put mean ms",
                "mean vs SQLite",
                "put_writes p50 ms",
                "bytes on disk",
                "bytes vs SQLite",
                "cold get_tuple ms",
            ],
            rows,
        )
    )
    print(
        f"\nserde bytes of all {args.steps} checkpoints (what a store without "
        f"compression or deltas holds): {serialized / 1e6:.1f} MB"
    )
    print(f"AfkLocalSaver second get_tuple on the same saver (builds its index): {warm_ms:.1f} ms")
    print(
        f"\n## Cold open from a fresh process: python start to the newest checkpoint "
        f"(median of {args.process_rounds} interleaved runs, ms)\n"
    )
    floor = process_ms["imports only"]
    rows = []
    for name, ms in process_ms.items():
        imported, first = after_imports_ms[name]
        sqlite_imported, sqlite_first = after_imports_ms["SqliteSaver"]
        rows.append(
            [
                name,
                f"{ms:.1f}",
                f"{ms / process_ms['SqliteSaver']:.2f}x",
                f"{ms - floor:+.1f}",
                f"{imported:.1f}",
                f"{first:.1f}",
                f"{first / sqlite_first:.2f}x",
                f"{imported + first:.1f}",
                f"{(imported + first) / (sqlite_imported + sqlite_first):.2f}x",
            ]
        )
    print(
        table(
            [
                "what",
                "ms",
                "vs SqliteSaver",
                "above imports only",
                "saver imports",
                "first get_tuple",
                "vs SQLite",
                "both",
                "vs SQLite",
            ],
            rows,
        )
    )
    print(
        f"SQLite pragmas in force: journal_mode={pragmas['journal_mode']}, "
        f"synchronous={pragmas['synchronous']}, "
        f"wal_autocheckpoint={pragmas['wal_autocheckpoint']}"
    )
    print(f"files: {base}")


if __name__ == "__main__":
    main()
