"""Tamper-evidence benchmark: what a key (HMAC-SHA256 on every record) costs.

Run: python benchmarks/bench_integrity.py [--dir DIR] [--quick]

Every keyed figure is compared with the same operation on an unkeyed store, measured
in the same run with the rows interleaved (order rotated every round) so disk state
and machine-load drift hit both alike:
- a ``sync`` checkpoint of a 10 KB job state (two fsyncs; the disk dominates);
- the same without fsync (fsync made a no-op; renames and the symlink swap remain);
- the pure CPU work of a checkpoint in memory (msgpack encode + zstd delta + frame),
  without and with its signature (SHA-256 of the record + HMAC), 10 KB and 1 MB states;
- a journaled ``effects.call`` (intent + outcome, each fsynced);
- a cold ``open(run).latest()`` and a ``verify()`` of a 300-checkpoint run.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from common import no_fsync, table, text

import afk_local as afk
from afk_local.storage.format import codec
from afk_local.storage.format.integrity import NO_MAC, Signer, record_digest

KEY = b"benchmark key"


class Job:
    """A job state of about ``size`` bytes that changes a little at every step."""

    def __init__(self, seed: int, size: int) -> None:
        self.rng = random.Random(seed)
        self.notes = [text(self.rng, 400) for _ in range(max(1, size // 450))]
        self.step = 0

    def next_state(self) -> dict[str, object]:
        self.step += 1
        self.notes[self.step % len(self.notes)] = text(self.rng, 400)
        return {"step": self.step, "notes": list(self.notes)}


def interleaved(fns: list[Callable[[int], object]], repeat: int) -> list[float]:
    """Median microseconds of each ``fn(i)``, the calls interleaved with a rotating order."""
    samples: list[list[float]] = [[] for _ in fns]
    for i in range(repeat):
        shift = i % len(fns)
        order = list(range(shift, len(fns))) + list(range(shift))
        for k in order:
            start = time.perf_counter_ns()
            fns[k](i)
            samples[k].append((time.perf_counter_ns() - start) / 1000)
    return [statistics.median(s) for s in samples]


def pair_row(label: str, plain: float, keyed: float) -> list[object]:
    return [label, f"{plain:.0f}", f"{keyed:.0f}", f"{keyed - plain:+.0f}", f"{keyed / plain:.2f}"]


def bench_checkpoints(base: Path, repeat: int, size: int, *, fsync: bool) -> list[object]:
    stores = [
        afk.Store(base / f"ck-{size}-{fsync}-plain"),
        afk.Store(base / f"ck-{size}-{fsync}-keyed", key=KEY),
    ]
    runs = [s.create("r") for s in stores]
    job = Job(1, size)
    states = [job.next_state() for _ in range(repeat)]

    def writer(run: afk.RunWriter) -> Callable[[int], object]:
        return lambda i: run.checkpoint("runtime_state", states[i], step=i + 1)

    if fsync:
        plain, keyed = interleaved([writer(r) for r in runs], repeat)
    else:
        with no_fsync():
            plain, keyed = interleaved([writer(r) for r in runs], repeat)
    for run in runs:
        run.close()
    what = "sync checkpoint" if fsync else "checkpoint, fsync off"
    return pair_row(f"{what}, {size / 1024:.0f} KB state", plain, keyed)


def bench_cpu(repeat: int, size: int) -> list[object]:
    job = Job(2, size)
    states = [job.next_state() for _ in range(repeat + 1)]
    record_codec = codec.RecordCodec()
    signer = Signer(KEY)

    def frame(i: int, sign: bool) -> bytes:
        raw = record_codec.encode(states[i + 1])
        body = codec.compress(raw, record_codec.encode(states[i]))
        mac = None
        if sign:
            mac = signer.checkpoint_mac("r", i + 2, "runtime_state", NO_MAC, record_digest(raw))
        return codec.pack_frame(codec.KIND_CHECKPOINT, body, flags=1, base_seq=i + 1, mac=mac)

    plain, keyed = interleaved([lambda i: frame(i, False), lambda i: frame(i, True)], repeat)
    return pair_row(
        f"in memory: encode + delta + frame (+ sign), {size / 1024:.0f} KB", plain, keyed
    )


def bench_effects(base: Path, repeat: int) -> list[object]:
    stores = [afk.Store(base / "fx-plain"), afk.Store(base / "fx-keyed", key=KEY)]
    runs = [s.create("r") for s in stores]
    result = {"text": "x" * 2000}

    def caller(run: afk.RunWriter) -> Callable[[int], object]:
        return lambda i: run.effects.call(f"k{i}", lambda: result)

    plain, keyed = interleaved([caller(r) for r in runs], repeat)
    for run in runs:
        run.close()
    return pair_row("effects.call (intent + outcome, 2 fsyncs), 2 KB result", plain, keyed)


def bench_reading(base: Path, count: int, repeat: int) -> list[list[object]]:
    stores = [afk.Store(base / "rd-plain"), afk.Store(base / "rd-keyed", key=KEY)]
    for store in stores:
        job = Job(3, 10_000)
        with no_fsync(), store.create("r") as run:  # fixture only: built without fsync
            for i in range(1, count + 1):
                run.checkpoint("runtime_state", job.next_state(), step=i)
                run.checkpoint("post_llm", {"i": i}, step=i)

    def opener(store: afk.Store) -> Callable[[int], object]:
        return lambda i: afk.Store(store.root, key=KEY if store.keyed else None).open("r").latest()

    def verifier(store: afk.Store) -> Callable[[int], object]:
        return lambda i: afk.Store(store.root, key=KEY if store.keyed else None).open("r").verify()

    plain_open, keyed_open = interleaved([opener(s) for s in stores], repeat)
    plain_verify, keyed_verify = interleaved([verifier(s) for s in stores], max(3, repeat // 20))
    return [
        pair_row(f"cold open + latest() ({2 * count} checkpoints)", plain_open, keyed_open),
        pair_row(f"verify() ({2 * count} checkpoints)", plain_verify, keyed_verify),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", help="directory on the disk to measure (default: a temp dir)")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (CI smoke run)")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="afk-bench-", dir=args.dir))
    repeat = 40 if args.quick else 300
    try:
        rows = [
            bench_checkpoints(base, repeat, 10_000, fsync=True),
            bench_checkpoints(base, repeat, 10_000, fsync=False),
            bench_checkpoints(base, max(10, repeat // 10), 1_000_000, fsync=False),
            bench_cpu(repeat, 10_000),
            bench_cpu(max(10, repeat // 10), 1_000_000),
            bench_effects(base, repeat),
            *bench_reading(base, 150, max(10, repeat // 5)),
        ]
        print(f"tamper evidence: unkeyed vs keyed store (median microseconds, {repeat} rounds)")
        print(table(["operation", "no key", "key", "difference", "ratio"], rows))
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
