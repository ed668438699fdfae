"""Thumbnails for many images on a Dask cluster: one durable run per image.

    pip install 'afk_local[dask]'
    python examples/fanout_dask.py                  # a local cluster of 2 worker processes
    python examples/fanout_dask.py --images 200     # kill it (or one worker) half-way, run again
    afk-local runs                                  # one run per image: fanout-thumbnail-000000...

Each image is one durable run and one Dask task. The "upload" is a journaled
step, so however often a worker dies, Dask re-runs the task, the run resumes
from its last checkpoint and no image is uploaded twice. Run it again and the
finished runs return their stored results without running. The runs and
uploads.txt live in $AFK_LOCAL_ROOT (default ./.afk), a directory every worker
sees; on a real cluster that is a network filesystem (docs/fanout.md).
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
from pathlib import Path

from distributed import Client, LocalCluster

import afk_local as afk
from afk_local.integrations.dask import map_durable


def render(name: str) -> str:
    """The expensive, repeatable part: here a digest stands in for the pixels."""
    return hashlib.blake2b(f"thumbnail of {name}".encode(), digest_size=8).hexdigest()


def upload(uploads: str, name: str, pixels: str) -> str:
    """The side effect that must happen once: append a line to uploads.txt."""
    with open(uploads, "a") as fh:
        fh.write(f"{name} {pixels}\n")
    return f"https://thumbs.example/{name}"


@afk.durable
def thumbnail(ctx: afk.RunContext, item: dict) -> dict:
    pixels = render(item["name"])
    url = ctx.step("upload", upload, item["uploads"], item["name"], pixels)
    return {"image": item["name"], "url": url}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--scheduler", help="a running Dask scheduler (default: a local cluster)")
    parser.add_argument(
        "--workers", type=int, default=2, help="worker processes of the local cluster"
    )
    args = parser.parse_args()
    logging.basicConfig(format="%(message)s")
    logging.getLogger("afk_local").setLevel(logging.INFO)  # progress lines when tqdm is absent

    root = Path(os.environ.get("AFK_LOCAL_ROOT", ".afk")).absolute()
    root.mkdir(parents=True, exist_ok=True)
    uploads = str(root / "uploads.txt")
    items = [{"name": f"img{i:04d}.jpg", "uploads": uploads} for i in range(args.images)]

    if args.scheduler:
        client = Client(args.scheduler)
        cluster = None
    else:
        cluster = LocalCluster(
            n_workers=args.workers, threads_per_worker=1, host="127.0.0.1", dashboard_address=None
        )
        client = Client(cluster)
    try:
        results = map_durable(thumbnail, items, store=root, client=client)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
    print(f"completed: {len(results)} thumbnails, first {results[0]['url']}")
    print(f"uploads: {len(Path(uploads).read_text().splitlines())}")


if __name__ == "__main__":
    main()
