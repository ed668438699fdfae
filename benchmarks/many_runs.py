"""Build a store of many finished runs fast, for the listing and sweep benchmarks.

    python benchmarks/many_runs.py DIR [--runs 100000]

Each run is what a one-step durable run leaves: ``run.meta`` (completed), a
``run_started`` and a ``run_terminal`` checkpoint, ``latest`` and ``owner.lock``, with
real encodings (its own run id in every record) but written without fsyncs: a store
that stands for months of work, made in seconds. One run in 1,000 is left ``running``
with no owner (interrupted), so that a sweep has something to find.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import msgspec

from afk_local.storage.format import codec
from afk_local.storage.format.codec import RecordCodec
from afk_local.storage.format.layout import RunPaths, checkpoint_name
from afk_local.storage.format.records import (
    SCHEMA_VERSION,
    Checkpoint,
    OwnerInfo,
    RunStatus,
)
from afk_local.storage.rundir.delta_policy import DeltaPolicy
from afk_local.storage.rundir.run_changes import tell_meta
from afk_local.storage.rundir.write.creation import new_run_meta
from afk_local.storage.store import Store


def _write(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def build_store(
    root: Path, runs: int, *, every_interrupted: int = 1000, told: bool = True
) -> Store:
    """A store at ``root`` holding ``runs`` finished one-step runs (see the module doc);
    ``told``: each run appended to ``runs.changes`` as the library's writers do (False:
    a store an older afk_local wrote, whose first lister reads every meta)."""
    store = Store(root)
    store.create("r-template").close()  # the store's identity and runs/, made durable
    record_codec = RecordCodec()
    owner = OwnerInfo(pid=1, hostname="bench", boot_id="", process_start=0)
    base = 1_700_000_000_000
    runs_dir = str(store.runs_dir)
    for i in range(runs):
        run_id = f"r-{i:07d}"
        stamp = base + i * 10
        status = RunStatus.RUNNING if i % every_interrupted == 7 else RunStatus.COMPLETED
        meta = new_run_meta(
            run_id, entrypoint="bench_runs:one_step", params={"args": [i], "kwargs": {}}
        )
        meta = msgspec.structs.replace(
            meta, status=status, created_ms=stamp, updated_ms=stamp + 5, owner=owner, attempt=1
        )
        d = f"{runs_dir}/{run_id}"
        os.mkdir(d, 0o700)
        _write(f"{d}/owner.lock", b"")
        _write(f"{d}/effects.log", b"")
        policy = DeltaPolicy(max_chain=32, delta_fraction=0.5, level=3)
        name = ""
        phases = [("run_started", {"agent_name": "one_step", "resumed": False})]
        if status is RunStatus.COMPLETED:
            phases.append(("run_terminal", {"state": "completed", "terminal_result": i}))
        for seq, (phase, payload) in enumerate(phases, start=1):
            record = Checkpoint(
                schema_version=SCHEMA_VERSION,
                run_id=run_id,
                thread_id=None,
                seq=seq,
                step=seq - 1,
                phase=phase,
                timestamp_ms=stamp + seq,
                payload=payload,
                journal_records=0,
            )
            name = checkpoint_name(seq, phase)
            _write(f"{d}/{name}", policy.frame(seq, phase, record_codec.encode(record), None))
        os.symlink(name, f"{d}/latest")
        _write(f"{d}/run.meta", codec.encode_meta(record_codec, meta))
        if told:  # what the library's writers append as they create and finish a run
            tell_meta(RunPaths(run_id, Path(d)), meta, None)
    return store


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--runs", type=int, default=100_000)
    args = parser.parse_args()
    t0 = time.perf_counter()
    build_store(args.dir, args.runs)
    print(f"{args.runs} runs in {time.perf_counter() - t0:.1f} s at {args.dir}")


if __name__ == "__main__":
    main()
