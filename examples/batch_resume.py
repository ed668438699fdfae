"""A 200-item batch job that you can kill at any moment and simply start again.

    python examples/batch_resume.py            # Ctrl-C or `kill -9` it half-way...
    python examples/batch_resume.py            # ...and run it again: it picks up where it died

Each item's "side effect" (here: appending to results.txt) runs through the
effect journal, so no item is written twice, however often the job dies. The
run lives in $AFK_LOCAL_ROOT (default ./.afk); inspect it with `afk-local runs`.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import afk_local as afk


def process_item(item: int, out_path: str, delay: float, *, idempotency_key: str) -> int:
    """The side effect: an outside system that deduplicates by idempotency key."""
    time.sleep(delay)
    out = Path(out_path)
    seen = out.read_text().split() if out.exists() else []
    if idempotency_key not in seen:
        with out.open("a") as fh:
            fh.write(f"{item} {idempotency_key}\n")
    return item * item


@afk.durable(durability="async")
def batch(ctx: afk.RunContext, n: int, out_path: str, delay: float, verbose: bool) -> dict:
    ctx.state.setdefault("sum", 0)
    for item in ctx.iterate(range(n), progress=not verbose):
        ctx.state["sum"] += ctx.step(
            "process", process_item, item, out_path, delay, idempotent=True
        )
        if verbose:
            print(f"done {item}", flush=True)
    return {"items": n, "sum": ctx.state["sum"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--run-id", default="batch-demo")
    parser.add_argument(
        "--out", default=os.path.join(os.environ.get("AFK_LOCAL_ROOT", ".afk"), "results.txt")
    )
    parser.add_argument("--delay", type=float, default=0.01, help="seconds of fake work per item")
    parser.add_argument("--verbose", action="store_true", help="one line per item instead of a bar")
    args = parser.parse_args()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    result = batch.run(args.items, args.out, args.delay, args.verbose, run_id=args.run_id)
    print(f"run {args.run_id}: {result}")


if __name__ == "__main__":
    main()
