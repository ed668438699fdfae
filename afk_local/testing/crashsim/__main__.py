"""``python -m afk_local.testing.crashsim``: explore crash states, exit 1 on a counterexample.

Exit codes: 0 every checked state recovered, 1 a counterexample was found (printed:
the call after which the crash came, what it lost, what a new process found), 2 usage.
With ``--mutant`` a counterexample is the expected outcome: the exit code is still 1.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from afk_local.testing.crashsim.explorer import (
    DEFAULT_MAX_STATES,
    MUTANTS,
    SECOND_CRASHES,
    SITE_MUTANTS,
    explore,
)
from afk_local.testing.crashsim.hunt import hunt_mutant, seam_call_sites
from afk_local.testing.crashsim.mutants import (
    LANGGRAPH_SITES,
    REMOTE_SITES,
    SUBSUMED_SITES,
    UNMODELLED_SITES,
)
from afk_local.testing.crashsim.registry import WORKLOADS
from afk_local.testing.crashsim.report import (
    counterexample_text,
    hunt_line,
    json_report,
    summary_line,
)
from afk_local.testing.crashsim.suites.outside import remote_available


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m afk_local.testing.crashsim",
        description="Record a workload's durable I/O calls, build every crash state a disk "
        "may leave after each call, and check that a new process recovers from each.",
    )
    parser.add_argument(
        "--workload",
        choices=[*WORKLOADS, "all"],
        default="all",
        help="which workload to explore (default: all)",
    )
    parser.add_argument(
        "--mutant",
        choices=[*MUTANTS, *SITE_MUTANTS, "sites"],
        metavar="MUTANT",
        help="remove one durability step (a kind of fsync, or one call site's: "
        f"{', '.join([*MUTANTS, *SITE_MUTANTS])}); the explorer must then find a "
        "counterexample; 'sites': every site mutant, each in the workloads that make its "
        "fsync until one that recovers without it catches it (a table)",
    )
    parser.add_argument(
        "--depth",
        type=int,
        choices=(1, 2),
        default=1,
        help="2: also re-run the interrupted operation inside crash states and crash it "
        "again (workloads that have a rerun)",
    )
    parser.add_argument(
        "--second-crashes",
        type=int,
        default=SECOND_CRASHES,
        metavar="N",
        help=f"with --depth 2: first crash states to re-run in (default {SECOND_CRASHES}; "
        "0: every one checked)",
    )
    parser.add_argument(
        "--max-states",
        type=int,
        default=DEFAULT_MAX_STATES,
        metavar="N",
        help=f"crash states checked per workload (default {DEFAULT_MAX_STATES}; 0: all of them)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random choice of states")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the explorer; returns the exit code."""
    args = _parser().parse_args(argv)
    if args.max_states < 0:
        _parser().error("--max-states must be 0 (all) or more")
    # Crash states make the library warn (torn tails, skipped files): expected here.
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    if args.mutant == "sites":
        return _site_table(args.max_states or None, args.depth, args.seed)
    names = list(WORKLOADS) if args.workload == "all" else [args.workload]
    results = []
    for name in names:
        result = explore(
            name,
            mutant=args.mutant,
            max_states=args.max_states or None,
            seed=args.seed,
            depth=args.depth,
            second_crashes=args.second_crashes or None,
        )
        results.append(result)
        if not args.json:  # one line as each workload finishes: a full run takes a while
            sys.stdout.write(summary_line(result) + "\n")
            sys.stdout.flush()
        if not result.ok:
            break
    found = next((r.counterexample for r in results if r.counterexample is not None), None)
    if args.json:
        sys.stdout.write(json_report(results))
    elif found is not None:
        sys.stdout.write("\n" + counterexample_text(found) + "\n")
    return 0 if found is None else 1


def _site_table(max_states: int | None, depth: int, seed: int) -> int:
    """Hunt every site mutant; print the table (docs/guarantees.md); 1 if one escapes
    (one of :data:`~.mutants.SUBSUMED_SITES` survives by construction, and says why)."""
    sites: dict[str, dict[tuple[str, str], int]] = {}
    baselines: dict[str, bool] = {}
    sys.stdout.write("| mutant | states checked | verdict |\n|---|---|---|\n")
    escaped = 0
    for mutant in SITE_MUTANTS:
        if SITE_MUTANTS[mutant] in REMOTE_SITES and not remote_available():
            sys.stdout.write(f"| {mutant} | 0 | not hunted: the remote extra is not installed |\n")
            continue
        if SITE_MUTANTS[mutant] in LANGGRAPH_SITES and "langgraph" not in WORKLOADS:
            sys.stdout.write(f"| {mutant} | 0 | not hunted: LangGraph is not installed |\n")
            continue
        found = hunt_mutant(
            mutant, max_states=max_states, depth=depth, seed=seed, sites=sites, baselines=baselines
        )
        subsumed = SUBSUMED_SITES.get(SITE_MUTANTS[mutant])
        escaped += found.caught is None and subsumed is None
        line = hunt_line(found)
        if found.caught is None and subsumed is not None:
            line = line[: -len(" |")] + f"; subsumed: {subsumed} |"
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
    # Every fsyncing call of the seam in the source: a site above, or a stated gap.
    with_mutant = {site for site, _ in SITE_MUTANTS.values()}
    sys.stdout.write(
        "\n| call site in the source | file | no site mutant because |\n|---|---|---|\n"
    )
    for site, file in sorted(seam_call_sites().items()):
        if site in with_mutant:
            continue
        reason = UNMODELLED_SITES.get(site)
        escaped += reason is None
        sys.stdout.write(
            f"| {site} | {file} | {reason or 'NOTHING: add a workload and a mutant'} |\n"
        )
    return 1 if escaped else 0


if __name__ == "__main__":
    raise SystemExit(main())
