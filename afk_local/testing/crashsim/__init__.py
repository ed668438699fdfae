"""A crash-state explorer in the style of ALICE and CrashMonkey.

It records every durable I/O call of a real workload, asks a model of the disk
(POSIX plus the ext4 ``data=ordered`` rules, :mod:`.model`) which states a crash
after each call may leave, builds each as a real directory tree and opens it
as a new process would: reader, ``verify``, resume with the journal. Every
acknowledged checkpoint and effect outcome must be there and readable, nothing
unreadable may be offered as ``latest``, the resume must work, and no effect
may run twice beyond a documented in-doubt retry.

Run it as ``python -m afk_local.testing.crashsim [--workload W] [--mutant M]
[--max-states N] [--seed S] [--json]``, or from Python::

    from afk_local.testing.crashsim import explore
    assert explore("sync").ok

docs/guarantees.md describes the model and how many states each workload explores.
"""

from __future__ import annotations

from afk_local.testing.crashsim.explorer import (
    DEFAULT_MAX_STATES,
    FULL_CAP,
    MUTANTS,
    Counterexample,
    Exploration,
    explore,
)
from afk_local.testing.crashsim.registry import WORKLOADS
from afk_local.testing.crashsim.workloads import Workload

__all__ = [
    "DEFAULT_MAX_STATES",
    "FULL_CAP",
    "MUTANTS",
    "WORKLOADS",
    "Counterexample",
    "Exploration",
    "Workload",
    "explore",
]
