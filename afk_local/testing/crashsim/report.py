"""The explorer's report: one line per workload, and the counterexample spelled out."""

from __future__ import annotations

import json
from collections.abc import Sequence

from afk_local.testing.crashsim.explorer import Counterexample, Exploration
from afk_local.testing.crashsim.hunt import MutantHunt

_SHOWN = 12
"""Lines of one list shown before "... and N more"."""


def _listed(title: str, lines: Sequence[str]) -> list[str]:
    if not lines:
        return []
    shown = [f"    {line}" for line in lines[:_SHOWN]]
    if len(lines) > _SHOWN:
        shown.append(f"    ... and {len(lines) - _SHOWN} more")
    return [f"  {title}:", *shown]


def counterexample_text(found: Counterexample) -> str:
    """A counterexample as a person reads it: where the crash was, what it lost, what broke."""
    mutant = f", mutant {found.mutant}" if found.mutant else ""
    lines = [f"COUNTEREXAMPLE in workload {found.workload}{mutant}"]
    if found.first_crash:
        lines += ["  crashed twice:", *(f"    {line}" for line in found.first_crash)]
        lines.append(f"  then, re-running it, crash right after call {found.op}")
    else:
        lines.append(f"  crash right after call {found.op}")
    lines += _listed("the crash lost", found.lost or ("nothing: every call persisted",))
    lines += _listed("the mutant removed", found.ignored)
    lines += _listed("a new process found", found.problems)
    return "\n".join(lines)


def summary_line(result: Exploration) -> str:
    """One line: what was recorded, how many states exist and were checked, the verdict."""
    if result.ok and result.mutant is not None and result.removed == 0:
        verdict = "nothing to remove (no such fsync in this workload)"
    elif result.ok:
        verdict = "every state recovers" if result.mutant is None else "NOT CAUGHT"
    else:
        verdict = f"counterexample after call #{result.counterexample.call}"  # type: ignore[union-attr]
    name = result.workload + (f" [{result.mutant}]" if result.mutant else "")
    again = (
        f" +{result.second_states} after {result.first_states_rerun} reruns"
        if result.first_states_rerun
        else ""
    )
    return (
        f"{name:<28} {result.calls:>4} calls {result.crash_points:>4} crash points "
        f"{result.combinations:>6} states allowed {result.states:>5} checked{again} "
        f"{result.seconds:>6.1f} s  {verdict}"
    )


def hunt_line(found: MutantHunt) -> str:
    """One row of the site-mutant table: the mutant, who caught it, with how many states."""
    if found.caught is not None:
        c = found.caught
        states = f"{c.states}" + (f"+{c.second_states}" if c.first_states_rerun else "")
        where = f"caught by {c.workload} after call #{c.counterexample.call}"  # type: ignore[union-attr]
    else:
        states = str(sum(e.states + e.second_states for e in found.tried))
        where = "NOT CAUGHT" + (
            f" (tried {', '.join(e.workload for e in found.tried)})" if found.tried else ""
        )
    skipped = f"; passed over {', '.join(found.skipped)}" if found.skipped else ""
    return f"| {found.mutant} | {states} | {where}{skipped} |"


def json_report(results: Sequence[Exploration]) -> str:
    """The report as JSON: ``ok`` and every exploration in full."""
    doc = {"ok": all(r.ok for r in results), "explorations": [r.to_dict() for r in results]}
    return json.dumps(doc, indent=2) + "\n"


__all__ = ["counterexample_text", "hunt_line", "json_report", "summary_line"]
