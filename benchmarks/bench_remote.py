"""Remote mirror benchmark: what ``Store(mirror=URL)`` costs a run, and push/pull throughput.

Run: python benchmarks/bench_remote.py [--dir DIR] [--steps N] [--checkpoints N] [--quick]
     python benchmarks/bench_remote.py --modes-only [--rounds N]   (section 3 only)

Two remotes, side by side: moto's S3 server (started in its own process on 127.0.0.1,
so it does not share this interpreter's GIL) and a local directory (``file://``).
Both are on this machine: the numbers measure afk_local's side and a fast endpoint,
not a network.

1. Mirror overhead on a ``sync`` job (a checkpoint and a journaled call per step,
   ~2 KB of state): wall time of the job body with no mirror vs. with each mirror
   (the local path only enqueues), then how long ``close()`` waits for the mirror
   to finish, and the total. The three runs are interleaved over rounds. Then the
   same with fsync made a no-op: what is left is CPU, including the GIL the uploader
   thread shares with the job.
2. Push and pull of one run of ``--checkpoints`` checkpoints (10,000 by default):
   checkpoints per second and MB/s, 16 requests in flight, once with one file per
   checkpoint and once after ``pack`` (a few pack files, uploaded by name).
3. Background mirror vs ``sync_effects`` on the same ``sync`` job: each journaled call
   waits for its intent and outcome to be on the remote (and the lease checked) with
   ``sync_effects``. The two modes alternate within each round, so their ratio holds on
   a machine other work keeps busy even when the absolute times do not.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from common import no_fsync, table, text

import afk_local as afk
from afk_local.integrations.remote import Bucket, RemoteMirror, pull_run, push_run

MOTO = """
import logging, sys, time
logging.getLogger("werkzeug").setLevel(logging.ERROR)
from moto.server import ThreadedMotoServer
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
print("%s:%d" % server.get_host_and_port(), flush=True)
sys.stdin.read()
server.stop()
"""


def start_moto() -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", MOTO], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    endpoint = "http://" + proc.stdout.readline().strip()
    os.environ.update(
        AWS_ENDPOINT_URL=endpoint,
        AWS_ALLOW_HTTP="true",
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_REGION="us-east-1",
    )
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/afk-bench", method="PUT")).read()
    return proc, "s3://afk-bench"


def job_run(store: afk.Store, run_id: str, steps: int, rng: random.Random) -> tuple[float, float]:
    """One sync job body: (seconds writing, seconds close() waited for the mirror)."""
    state: dict[str, object] = {"notes": []}
    started = time.perf_counter()
    run = store.create(run_id)
    for i in range(steps):
        key = f"call#{i}"
        run.effects.record_intent(key, name="tool", input_hash=str(i), idempotency_key=key)
        run.effects.record_outcome(key, status="ok", result=i)
        notes = state["notes"]
        assert isinstance(notes, list)
        notes.append(text(rng, 40))
        del notes[:-40]
        run.checkpoint("runtime_state", state, step=i)
    body = time.perf_counter() - started
    started = time.perf_counter()
    run.close()  # waits for the mirror
    return body, time.perf_counter() - started


def mirror_overhead(base: Path, remotes: dict[str, str], steps: int, rounds: int) -> str:
    rows: dict[str, list[tuple[float, float]]] = {"none": [], **{k: [] for k in remotes}}
    names = list(rows)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            url = remotes.get(name, "")
            store = afk.Store(base / f"mirror-{name}-{r}", mirror=url)
            rows[name].append(job_run(store, f"job-{r}", steps, random.Random(r)))
    none_body = statistics.median(b for b, _ in rows["none"])
    out = []
    for name in names:
        body = statistics.median(b for b, _ in rows[name])
        drain = statistics.median(d for _, d in rows[name])
        out.append(
            (
                name,
                f"{body / steps * 1e3:.2f}",
                f"{body / none_body:.2f}x",
                f"{drain * 1e3:.0f}",
                f"{(body + drain) / none_body:.2f}x",
            )
        )
    return table(
        (
            "mirror",
            "ms per step (ckpt + call)",
            "body vs none",
            "close() waits ms",
            "total vs none",
        ),
        out,
    )


def mode_cost(base: Path, remotes: dict[str, str], steps: int, rounds: int) -> str:
    """Background mirror vs ``sync_effects``: job body plus close(), interleaved."""
    rows = []
    for name, url in remotes.items():
        times: dict[bool, list[float]] = {False: [], True: []}
        ratios = []
        for r in range(rounds):
            pair = {}
            for sync in (r % 2 == 1, r % 2 == 0):  # alternate which mode goes first
                root = base / f"modes-{name[:4]}-{int(sync)}-{r}"
                mirror = RemoteMirror(f"{url}/{int(sync)}-{r}", root=root, sync_effects=sync)
                body, drain = job_run(
                    afk.Store(root, mirror=mirror), "job", steps, random.Random(r)
                )
                pair[sync] = body + drain
                times[sync].append(body + drain)
            ratios.append(pair[True] / pair[False])
        background, synced = (statistics.median(times[m]) for m in (False, True))
        rows.append(
            (
                name,
                f"{background / steps * 1e3:.2f}",
                f"{synced / steps * 1e3:.2f}",
                f"{statistics.median(ratios):.2f}x",
                f"{min(ratios):.2f}x-{max(ratios):.2f}x",
            )
        )
    return table(
        (
            "remote",
            "background ms/step",
            "sync_effects ms/step",
            "sync / background (median of rounds)",
            "range",
        ),
        rows,
    )


def make_big_run(store: afk.Store, run_id: str, n: int) -> int:
    rng = random.Random(7)
    with store.create(run_id) as run:
        for i in range(n):
            run.checkpoint("runtime_state", {"i": i, "note": text(rng, 300)}, step=i)
    return sum(p.stat().st_size for p in store.paths(run_id).dir.iterdir() if p.is_file())


def throughput(base: Path, remotes: dict[str, str], n: int) -> str:
    rows = []
    sizes = {}
    for layout in ("loose", "packed"):
        source = afk.Store(base / f"source-{layout}", pack_loose_limit=None)
        make_big_run(source, "big", n)
        if layout == "packed":
            source.pack(["big"])  # afk-local pack: a few pack files and the newest loose
        files = [p for p in source.paths("big").dir.iterdir() if p.is_file()]
        sizes[layout] = sum(p.stat().st_size for p in files)
        size = sizes[layout]
        reader = source.open("big")
        expected = {f.seq: reader.load(f).payload for f in reader.checkpoint_files()}
        for name, base_url in remotes.items():
            url = f"{base_url}-{layout}"
            if url.startswith("file://"):
                Path(url[len("file://") :]).mkdir(parents=True, exist_ok=True)
            started = time.perf_counter()
            push_run(source, url, "big")
            push_s = time.perf_counter() - started
            started = time.perf_counter()
            again = push_run(source, url, "big")
            noop_s = time.perf_counter() - started
            assert again.up_to_date
            target = afk.Store(base / f"pulled-{name}-{layout}")
            started = time.perf_counter()
            pull_run(target, url, "big")
            pull_s = time.perf_counter() - started
            pulled = target.open("big")
            assert {f.seq: pulled.load(f).payload for f in pulled.checkpoint_files()} == expected
            rows.append(
                (
                    name,
                    layout,
                    str(len(files)),
                    f"{n / push_s:.0f}",
                    f"{size / push_s / 1e6:.2f}",
                    f"{noop_s:.2f}",
                    f"{n / pull_s:.0f}",
                    f"{size / pull_s / 1e6:.2f}",
                )
            )
    header = (
        f"{n} checkpoints: {sizes['loose'] / 1e6:.2f} MB loose, "
        f"{sizes['packed'] / 1e6:.2f} MB packed"
    )
    return (
        header
        + "\n\n"
        + table(
            (
                "remote",
                "run",
                "files",
                "push ckpt/s",
                "push MB/s",
                "push again (nothing new) s",
                "pull ckpt/s (verified)",
                "pull MB/s",
            ),
            rows,
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", help="where stores and the file:// bucket go (default: /tmp)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--checkpoints", type=int, default=10_000)
    parser.add_argument("--quick", action="store_true", help="100 steps, 1,000 checkpoints")
    parser.add_argument("--modes-only", action="store_true", help="only background vs sync_effects")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.checkpoints, args.rounds = 100, 1000, 2
    base = Path(tempfile.mkdtemp(prefix="afk-bench-remote-", dir=args.dir))
    moto, s3 = start_moto()
    try:
        remotes = {"s3 (moto)": f"{s3}/m", "file://": (base / "bucket").absolute().as_uri()}
        Bucket(remotes["file://"])
        if args.modes_only:
            print(f"Background mirror vs sync_effects, {args.steps} steps, {args.rounds} rounds\n")
            print(mode_cost(base, remotes, args.steps, args.rounds))
            return
        print(f"Mirror overhead, sync job, {args.steps} steps, median of {args.rounds} rounds\n")
        print(mirror_overhead(base, remotes, args.steps, args.rounds))
        print("\nThe same without fsync (CPU and GIL cost of the mirror thread, no disk noise)\n")
        remotes = {"s3 (moto)": f"{s3}/n", "file://": (base / "bucket-n").absolute().as_uri()}
        with no_fsync():
            print(mirror_overhead(base / "nofsync", remotes, args.steps, args.rounds))
        remotes = {"s3 (moto)": f"{s3}/t", "file://": (base / "bucket2").absolute().as_uri()}
        print("\nPush and pull of one run\n")
        print(throughput(base, remotes, args.checkpoints))
        remotes = {"s3 (moto)": f"{s3}/s", "file://": (base / "bucket3").absolute().as_uri()}
        print("\nBackground mirror vs sync_effects (interleaved)\n")
        print(mode_cost(base, remotes, args.steps, args.rounds))
    finally:
        assert moto.stdin is not None
        moto.stdin.close()
        moto.wait(30)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
