"""Change the code of a job that has a run in flight, then resume that run safely.

    python examples/code_change.py --code v1 --die-after 2   # charges a and b, then dies
    python examples/code_change.py --code v2                 # adds a fee: resume refused
    python examples/code_change.py --code v2-patched         # the fee behind ctx.patched

v1 charges every item. v2 charges a fee before each charge: the interrupted run
journaled "charge a, charge b" with no fee in between, so v2 no longer reproduces it;
the replay check says where, and the resume refuses before any effect. v2-patched puts
the fee behind ``ctx.patched("fee")``: the run keeps its recorded path for a and b,
takes the fee from c on (it reaches c live), and every new run takes the fee path.
The outside world is ledger.txt; each charge must appear there once.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import afk_local as afk
import afk_local.testing

LEDGER = Path("ledger.txt")
CODE = "v1"  # which version of the job this process runs (as if the file were edited)
DIE_AFTER: int | None = None


def charge(item: str, amount: int) -> str:
    """The side effect: money moves."""
    with LEDGER.open("a") as fh:
        fh.write(f"charge {item} {amount}\n")
    return f"receipt-{item}"


def fee(item: str) -> int:
    """v2's new side effect: a fee before each charge."""
    with LEDGER.open("a") as fh:
        fh.write(f"fee {item}\n")
    return 1


@afk.durable(on_code_change="replay")
def checkout(ctx: afk.RunContext, items: list[str]) -> list[str]:
    receipts = []
    for n, item in enumerate(items):
        if CODE == "v2" or (CODE == "v2-patched" and ctx.patched("fee")):
            ctx.step("fee", fee, item)
        receipts.append(ctx.step("charge", charge, item, 10))
        if DIE_AFTER is not None and n + 1 == DIE_AFTER:
            raise RuntimeError("the machine went away")
    return receipts


def main() -> None:
    global CODE, DIE_AFTER
    parser = argparse.ArgumentParser()
    parser.add_argument("--code", choices=("v1", "v2", "v2-patched"), default="v1")
    parser.add_argument("--die-after", type=int)
    args = parser.parse_args()
    CODE, DIE_AFTER = args.code, args.die_after
    store = afk.Store()

    if not store.exists("order-1"):
        try:
            checkout.run(["a", "b", "c"], run_id="order-1")
        except RuntimeError as exc:
            print(f"order-1 stopped: {exc}")
        print("ledger:", LEDGER.read_text().split("\n")[:-1])
        return

    # Would the run resume under this code? (afk-local replay order-1 says the same)
    try:
        afk_local.testing.replay(store, "order-1")
        print(f"{CODE} reproduces order-1's journal")
    except afk.ReplayDivergence as divergence:
        print(f"{CODE} diverges at call {divergence.position}: the run recorded "
              f"{divergence.recorded}, the code asks {divergence.asked}")  # fmt: skip
    try:
        print("order-1:", checkout.run(run_id="order-1"))
    except afk.ReplayDivergence as refused:
        print("resume refused:", refused)
        return
    print("order-2:", checkout.run(["d"], run_id="order-2"))
    print("ledger:", LEDGER.read_text().split("\n")[:-1])


if __name__ == "__main__":
    main()
