"""What hostile runs name, for the attack tests (importable by children as ``attack_jobs``).

``touch_marker`` is a legitimate ``@afk.durable`` job: a run that names it executes
it, which creates the file it is given. A store an attacker could write must never
get that far.
"""

from __future__ import annotations

from pathlib import Path

import afk_local as afk


@afk.durable
def touch_marker(ctx: afk.RunContext, path: str) -> str:
    """Create ``path`` (the marker that shows the job ran)."""
    Path(path).write_text("ran\n", encoding="utf-8")
    return "ran"


def plain_function(context: dict) -> None:
    """Not an agent factory: must never be called from a run's entrypoint."""
    raise AssertionError("called")
