"""A checkout job whose code changes between attempts, for the replay and patch tests.

Importable as ``replay_jobs`` (tests/support is on sys.path and on the children's
PYTHONPATH). ``REPLAY_CODE`` says which version of the code this process runs, as if
the file had been edited between two attempts (the entrypoint stays
``replay_jobs:checkout``):

- ``v1``: each item is charged (``charge(item, 10)``);
- ``v2``: each item first pays a fee (``fee(item)``), then is charged;
- ``v2-patched``: the fee behind ``ctx.patched("fee")``;
- ``v3-deprecated``: the fee for every item, ``ctx.deprecate_patch("fee")`` in place;
- ``renamed``: the charge step is called ``bill``;
- ``argchanged``: items are charged 20.

Every call of a step function appends a line to ``REPLAY_SIDE`` (``charge a 10``,
``fee a``): the outside world, which must see each charge once. The child prints
``CHARGED <item>`` / ``FEE <item>`` after each step returned, and stalls when the line
equals ``REPLAY_STALL_AT`` so that the parent can SIGKILL it there.
"""

from __future__ import annotations

import os
import sys
import time

import afk_local as afk


def say(line: str) -> None:
    """Print ``line`` for the parent; stall if the parent wants to kill us right here."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
    if os.environ.get("REPLAY_STALL_AT") == line:
        time.sleep(120)  # the parent SIGKILLs us; never reached in a finished test


def _outside(line: str) -> None:
    with open(os.environ["REPLAY_SIDE"], "a", encoding="utf-8") as fh:
        fh.write(line + "\n")


def charge(item: str, amount: int) -> str:
    """Charge ``item``: the side effect that must happen once."""
    _outside(f"charge {item} {amount}")
    return f"receipt-{item}"


def fee(item: str) -> int:
    """The fee that v2 adds before each charge."""
    _outside(f"fee {item}")
    return 1


def _fee(ctx: afk.RunContext, item: str, code: str) -> None:
    if code == "v2" or (code == "v2-patched" and ctx.patched("fee")):
        ctx.step("fee", fee, item)
        say(f"FEE {item}")
    elif code == "v3-deprecated":
        ctx.deprecate_patch("fee")
        ctx.step("fee", fee, item)
        say(f"FEE {item}")


@afk.durable(on_code_change="replay")
def checkout(ctx: afk.RunContext, items: list[str]) -> list[str]:
    """Charge every item (v2 and later: pay a fee first)."""
    code = os.environ.get("REPLAY_CODE", "v1")
    receipts = []
    for item in items:
        _fee(ctx, item, code)
        name = "bill" if code == "renamed" else "charge"
        amount = 20 if code == "argchanged" else 10
        receipts.append(ctx.step(name, charge, item, amount))
        say(f"CHARGED {item}")
    return receipts
