"""Check your own job survives a kill at any moment: kill_sweep kills it everywhere.

    python examples/kill_sweep_check.py              # 6 sampled kill points
    python examples/kill_sweep_check.py --all        # every durable I/O call (slower)

The job below bills customers; ``send_invoice`` is the side effect that must happen
once, so it writes a line to the sweep's effect log (``record_effect``, which does
nothing outside a sweep). ``kill_sweep`` runs the job once to its end, then, for
each kill point, runs it in a fresh child process, SIGKILLs it at that durable I/O
call, resumes it (``afk-local resume``, ``afk-local watch --once`` or the same call,
in turn) and checks it ends as the uninterrupted run did: same result, every
invoice sent once, or reported in doubt with the ``afk-local settle`` command.
In a pytest suite the ``kill_sweep`` fixture does the same (docs/testing.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import afk_local as afk
from afk_local.testing import kill_sweep, record_effect


def send_invoice(customer: str, amount: int) -> str:
    """The outside effect (an email, a payment): it must happen once per customer."""
    record_effect(f"invoice {customer} {amount}")
    return f"invoice sent to {customer} for {amount} EUR"


@afk.durable
def bill(ctx: afk.RunContext, customers: list[str], amount: int) -> list[str]:
    """Send each customer an invoice, each as a journaled step."""
    sent: list[str] = ctx.state.setdefault("sent", [])
    for customer in ctx.iterate(customers, progress=False):
        sent.append(ctx.step("invoice", send_invoice, customer, amount))
    return list(sent)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="every kill point, not a sample")
    parser.add_argument("--sample", type=int, default=6, help="kill points to try")
    args = parser.parse_args()

    # The children import the job by module name, as any process resuming it would.
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from kill_sweep_check import bill as job  # noqa: PLC0415 - this file, as a module

    swept = kill_sweep(job, ["ada", "bob"], 42, sample=None if args.all else args.sample)
    for trial in swept.trials:
        print(f"killed at call {trial.point:3d} {trial.where or '(not reached)'}")
        print(f"    resumed by {trial.resume}: {trial.ending}")
    swept.check()  # raises AssertionError naming every wrong ending
    print(f"{len(swept.trials)} of {swept.calls} kill points tried: 0 wrong endings")


if __name__ == "__main__":
    main()
