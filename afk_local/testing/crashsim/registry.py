"""Every workload the explorer knows, by name: the single operations, the composed rewrites,
then the operations that write besides checkpoints (:mod:`.operations`), the edits of
a run (:mod:`.edits`), the store's own files (:mod:`.store_files`), a faulty disk or a
fenced run (:mod:`.faults`), what afk_local writes outside the runs (:mod:`.outside`: the
watcher's service file, and with the remote extra installed, pulls into a new root and
over an older copy), and with LangGraph installed, its saver's (:mod:`.langgraph`)."""

from __future__ import annotations

from importlib.util import find_spec

from afk_local.testing.crashsim.suites.edits import EDIT_WORKLOADS
from afk_local.testing.crashsim.suites.faults import FAULT_WORKLOADS
from afk_local.testing.crashsim.suites.operations import OPERATION_WORKLOADS
from afk_local.testing.crashsim.suites.outside import (
    OUTSIDE_WORKLOADS,
    REMOTE_WORKLOADS,
    remote_available,
)
from afk_local.testing.crashsim.suites.rewrites import REWRITE_WORKLOADS
from afk_local.testing.crashsim.suites.store_files import STORE_FILE_WORKLOADS
from afk_local.testing.crashsim.workloads import BASIC_WORKLOADS, Workload


def _extra_workloads() -> tuple[Workload, ...]:
    """The workloads of the optional extras that are installed (the LangGraph saver's)."""
    if find_spec("langgraph") is None:
        return ()
    from afk_local.testing.crashsim.suites.langgraph import LANGGRAPH_WORKLOADS  # noqa: PLC0415

    return LANGGRAPH_WORKLOADS


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        *BASIC_WORKLOADS,
        *REWRITE_WORKLOADS,
        *OPERATION_WORKLOADS,
        *EDIT_WORKLOADS,
        *STORE_FILE_WORKLOADS,
        *FAULT_WORKLOADS,
        *OUTSIDE_WORKLOADS,
        *(REMOTE_WORKLOADS if remote_available() else ()),
        *_extra_workloads(),
    )
}
"""Every workload by name, in the order the explorer runs them."""

__all__ = ["WORKLOADS"]
