"""Effect journal: durable appends per second and open time, against raw floors.

    python benchmarks/bench_journal.py [--dir DIR] [--appends N] [--quick]

Appends: every journal append is durable (one write + fsync, or a shared fsync
under group commit). The floor is the same frame bytes appended with
``os.write`` + ``os.fsync`` per record on an O_APPEND file, in this run, on the
same directory; the ratios are what matters, absolute numbers depend on the disk.

Open: journals of 10 000 and 100 000 records (intent + outcome pairs) are built
directly as frames in one write WITHOUT fsync (a fixture, not a durability
measurement), then opened read-only. The floor is reading the file and
checking every frame's crc32 (any scan must do at least that).
"""

from __future__ import annotations

import argparse
import os
import statistics
import struct
import tempfile
import threading
import time
import zlib
from pathlib import Path

import msgspec

from afk_local.journal.journal import Journal
from afk_local.journal.replay import idempotency_key, input_hash
from afk_local.storage import fsio
from afk_local.storage.format.records import Effect


def outcome(i: int) -> Effect:
    return Effect(
        kind="outcome",
        key=f"tool:{i}",
        timestamp_ms=1_700_000_000_000 + i,
        status="ok",
        output_hash="0" * 32,
        result={"status": 200, "body": f"response {i} " * 8},
    )


def intent(i: int) -> Effect:
    return Effect(
        kind="intent",
        key=f"tool:{i}",
        timestamp_ms=1_700_000_000_000 + i,
        step=i // 4,
        name="call_tool",
        input_hash=input_hash("call_tool", (i,), {}),
        idempotency_key=idempotency_key("bench", f"tool:{i}"),
    )


def frame(effect: Effect) -> bytes:
    body = msgspec.msgpack.encode(effect)
    return struct.pack("<II", len(body), zlib.crc32(body)) + body


def raw_floor(path: Path, frames: list[bytes]) -> float:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        start = time.perf_counter()
        for data in frames:
            os.write(fd, data)
            os.fsync(fd)
        return time.perf_counter() - start
    finally:
        os.close(fd)


FSYNCS: dict[str, int] = {}


def _count_fsyncs(operation: str, target: str) -> None:
    if operation == "fsync":
        FSYNCS[target] = FSYNCS.get(target, 0) + 1


def journal_appends(path: Path, effects: list[Effect], threads: int) -> float:
    journal = Journal(path, "bench", writable=True)
    FSYNCS[str(path)] = 0
    chunks = [effects[t::threads] for t in range(threads)]

    def worker(chunk: list[Effect]) -> None:
        for effect in chunk:
            journal.append(effect)

    workers = [threading.Thread(target=worker, args=(c,)) for c in chunks]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - start
    journal.close()
    FSYNCS[f"records/fsync {threads}"] = len(effects) / FSYNCS[str(path)]
    return elapsed


def build_fixture(path: Path, records: int) -> None:
    """Intent/outcome pairs written in one go, without fsync (fixture only)."""
    parts = []
    for i in range(records // 2):
        parts.append(frame(intent(i)))
        parts.append(frame(outcome(i)))
    path.write_bytes(b"".join(parts))


def crc_scan_floor(path: Path) -> float:
    start = time.perf_counter()
    data = path.read_bytes()
    pos = 0
    view = memoryview(data)
    while pos < len(data):
        length, crc = struct.unpack_from("<II", data, pos)
        if zlib.crc32(view[pos + 8 : pos + 8 + length]) != crc:
            raise SystemExit("fixture damaged")
        pos += 8 + length
    return time.perf_counter() - start


def best(fn, repeat: int = 3) -> float:
    return min(fn() for _ in range(repeat))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dir", default=None, help="directory on the disk to measure (default: tmp)"
    )
    parser.add_argument("--appends", type=int, default=2000)
    parser.add_argument("--quick", action="store_true", help="fewer appends, 10k open only")
    args = parser.parse_args()
    n = 300 if args.quick else args.appends
    base = Path(tempfile.mkdtemp(prefix="bench-journal-", dir=args.dir))
    effects = [intent(i) if i % 2 == 0 else outcome(i) for i in range(n)]
    frames = [frame(e) for e in effects]
    print(f"directory: {base}  appends: {n}  mean frame: {statistics.mean(map(len, frames)):.0f} B")

    fsio.set_io_hook(_count_fsyncs)  # counts the journal's fsyncs (records per fsync)
    floor = best(lambda: raw_floor(base / f"raw-{time.perf_counter_ns()}", frames), 2)
    one = best(lambda: journal_appends(base / f"j1-{time.perf_counter_ns()}", effects, 1), 2)
    eight = best(lambda: journal_appends(base / f"j8-{time.perf_counter_ns()}", effects, 8), 2)
    print()
    one_batch, eight_batch = FSYNCS["records/fsync 1"], FSYNCS["records/fsync 8"]
    print(f"{'durable appends':<34}{'appends/s':>12}{'vs raw floor':>14}{'records/fsync':>15}")
    print(f"{'raw floor: os.write+fsync, 1 thr':<34}{n / floor:>12.0f}{1.0:>13.2f}x{1.0:>15.1f}")
    print(
        f"{'Journal.append, 1 thread':<34}{n / one:>12.0f}{floor / one:>13.2f}x{one_batch:>15.1f}"
    )
    print(
        f"{'Journal.append, 8 threads (group)':<34}{n / eight:>12.0f}{floor / eight:>13.2f}x"
        f"{eight_batch:>15.1f}"
    )

    print()
    print(f"{'open (read-only)':<34}{'seconds':>12}{'vs crc scan':>14}{'per record':>12}")
    for records in (10_000,) if args.quick else (10_000, 100_000):
        path = base / f"open-{records}.log"
        build_fixture(path, records)
        scan = best(lambda: crc_scan_floor(path))  # noqa: B023 - called right away
        opened = best(lambda: _open_time(path, records))  # noqa: B023
        size_mb = path.stat().st_size / 1e6
        label = f"{records} records ({size_mb:.1f} MB)"
        print(f"{label:<34}{opened:>12.3f}{opened / scan:>13.2f}x{opened / records * 1e6:>10.1f}us")
        print(f"{'  floor: read + crc32 every frame':<34}{scan:>12.3f}{1.0:>13.2f}x")
    for child in base.iterdir():
        child.unlink()
    base.rmdir()


def _open_time(path: Path, records: int) -> float:
    start = time.perf_counter()
    journal = Journal(path, "bench", writable=False)
    elapsed = time.perf_counter() - start
    assert len(journal) == records and journal.torn_tail is None
    state = journal.lookup(f"tool:{records // 2 - 1}")
    assert state is not None and state.outcome is not None
    journal.close()
    return elapsed


if __name__ == "__main__":
    main()
