"""The workload of the LangGraph saver (``afk_local[langgraph]``): what it writes, crashed.

:class:`~afk_local.integrations.langgraph.AfkLocalSaver` keeps each thread in a run
directory: checkpoint files, the pending writes of each checkpoint (``langgraph.writes``,
appended and fsynced by ``put_writes``) and an index cache of the checkpoints
(``langgraph.index``, whose tombstones are fsynced before a deleted checkpoint's name can
be used again). The workload deletes the checkpoints of one LangGraph run from a thread,
puts a checkpoint whose file takes a deleted one's name, starts a new thread and deletes
another, and holds every crash state to what docs/langgraph.md promises: acknowledged
checkpoints and writes are there, a deleted thread stays deleted, and a new saver's
listing never shows what is gone nor hides what is there (it is compared with the
checkpoint files themselves, decoded one by one).

The extra is optional: the registry imports this module, and lists its workload, only
when LangGraph is installed (the one import of an integration by ``afk_local.testing``,
allowed by name in the import contracts). The saver, and with it LangGraph, is imported
when the workload runs, not with the registry: ``import afk_local.testing`` (every test
worker, its fork server, ``python -m afk_local.testing.crashsim``) does not pay for it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from afk_local.storage.format.frames import encode_frame
from afk_local.storage.store import Store
from afk_local.testing.crashsim.trace import Session
from afk_local.testing.crashsim.workloads import Workload

if TYPE_CHECKING:
    from afk_local.integrations.langgraph.saver import AfkLocalSaver

Listing = dict[str, list[tuple[str, str, Any]]]
"""A thread as read back: checkpoint id -> its pending writes ``(task, channel, value)``."""


def _saver(store: Store) -> AfkLocalSaver:
    from afk_local.integrations.langgraph.saver import AfkLocalSaver  # noqa: PLC0415

    return AfkLocalSaver(store)


def _thread_run_id(thread: str) -> str:
    from afk_local.integrations.langgraph.threads import thread_run_id  # noqa: PLC0415

    return thread_run_id(thread)


def _checkpoint(cid: str, step: int) -> dict[str, Any]:
    return {
        "v": 1,
        "id": cid,
        "ts": "2025-01-01T00:00:00+00:00",
        "channel_values": {"step": step, "log": [f"line {i} " * 8 for i in range(step + 1)]},
        "channel_versions": {"step": step, "log": step},
        "versions_seen": {},
        "updated_channels": None,
    }


def _put(
    saver: AfkLocalSaver, thread: str, cid: str, step: int, *, parent: str | None, run: str
) -> Any:
    conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ""}
    if parent is not None:
        conf["checkpoint_id"] = parent
    metadata = {"source": "loop", "step": step, "run_id": run}
    return saver.put({"configurable": conf}, _checkpoint(cid, step), metadata, {})  # type: ignore[arg-type]


def _listed(store: Store, thread: str) -> Listing:
    """What a new saver lists for ``thread``, with each checkpoint's pending writes."""
    saver = _saver(store)
    try:
        found: Listing = {}
        for item in saver.list({"configurable": {"thread_id": thread}}):
            cid = item.config["configurable"]["checkpoint_id"]
            found[cid] = sorted(item.pending_writes or [], key=repr)
        return found
    finally:
        saver.close()


def _on_disk(store: Store, thread: str) -> set[str]:
    """The ids of ``thread``'s checkpoint files, each decoded (the truth the index caches)."""
    from afk_local.integrations.langgraph.index import PHASE, Payload  # noqa: PLC0415

    run_id = _thread_run_id(thread)
    if not store.exists(run_id):
        return set()
    reader = store.open(run_id)
    return {
        msgspec.convert(reader.load(f).payload, Payload).id
        for f in reader.checkpoint_files()
        if f.phase == PHASE
    }


def _holds(thread: str, present: Listing, gone: set[str]) -> Callable[[Store], str | None]:
    """The claim that a new saver lists ``present`` (with these writes) and none of
    ``gone`` for ``thread``."""

    def problem(store: Store) -> str | None:
        listed = _listed(store, thread)
        missing = sorted(set(present) - set(listed))
        changed = sorted(c for c in present if c in listed and listed[c] != present[c])
        back = sorted(gone & set(listed))
        if not (missing or changed or back):
            return None
        return (
            f"thread {thread}: missing {missing}, other pending writes for {changed}, "
            f"deleted but listed {back}"
        )

    return problem


def _setup(store: Store, _scratch: Path) -> None:
    from afk_local.integrations.langgraph.index import INDEX_NAME  # noqa: PLC0415

    with _saver(store) as saver:
        c1 = _put(saver, "t", "c1", 1, parent=None, run="r1")
        saver.put_writes(c1, [("ch", "w1")], "task-1")
        c2 = _put(saver, "t", "c2", 2, parent="c1", run="r1")
        saver.put_writes(c2, [("ch", "w2")], "task-2")
        c3 = _put(saver, "t", "c3", 3, parent="c2", run="r2")
        saver.put_writes(c3, [("ch", "w3")], "task-3")
        g1 = _put(saver, "gone", "g1", 1, parent=None, run="r1")
        saver.put_writes(g1, [("ch", "g")], "task-g")
    # A crash cut an append to thread t's index cache (it is never fsynced on its own):
    # the next open of the cache cuts the torn tail.
    with open(store.paths(_thread_run_id("t")).dir / INDEX_NAME, "ab") as index:
        index.write(encode_frame(b"\x95" * 120)[:50])


def _record(session: Session, _prepared: Any) -> None:
    store = session.store
    saver = _saver(store)
    try:
        w1, w2 = [("task-1", "ch", "w1")], [("task-2", "ch", "w2")]
        session.claim_acked("the saver's thread t", _holds("t", {"c1": w1, "c2": w2}, set()))
        saver.delete_for_runs(["r2"])  # c3 deleted: a tombstone, the files, latest, writes
        session.claim_acked("delete_for_runs(['r2'])", _holds("t", {}, {"c3"}))
        c4 = _put(saver, "t", "c4", 3, parent="c2", run="r3")  # its file takes c3's name
        saver.put_writes(c4, [("ch", "w4")], "task-4")
        w4 = [("task-4", "ch", "w4")]
        session.claim_acked("put c4 and its writes", _holds("t", {"c4": w4}, {"c3"}))
        n1 = _put(saver, "n", "n1", 1, parent=None, run="r3")  # a new thread: its writes file made
        saver.put_writes(n1, [("ch", "n")], "task-n")
        session.claim_acked("thread n", _holds("n", {"n1": [("task-n", "ch", "n")]}, set()))
        gone = _thread_run_id("gone")
        session.run_removed(gone)
        saver.delete_thread("gone")
        session.rewrite_done(gone, "delete_thread")  # and it stays deleted
        session.claim_acked("delete_thread('gone')", _holds("gone", {}, {"g1"}))
    finally:
        saver.close()


def _resume(store: Store) -> dict[str, Any]:
    """A new process: every thread's listing agrees with its files, and thread t takes a
    new checkpoint on top of its newest."""
    outcomes: dict[str, Any] = {}
    for thread in ("t", "n", "gone"):
        listed, files = set(_listed(store, thread)), _on_disk(store, thread)
        outcomes[f"listing {thread}"] = (
            "agrees" if listed == files else f"lists {sorted(listed)}, files hold {sorted(files)}"
        )
    with _saver(store) as saver:
        newest = saver.get_tuple({"configurable": {"thread_id": "t"}})
        parent = None if newest is None else newest.config["configurable"]["checkpoint_id"]
        _put(saver, "t", "c9", 9, parent=parent, run="r9")
        again = saver.get_tuple({"configurable": {"thread_id": "t"}})
    outcomes["t"] = "continued" if again is not None and again.checkpoint["id"] == "c9" else again
    return outcomes


LANGGRAPH_WORKLOADS: tuple[Workload, ...] = (
    Workload(
        "langgraph",
        "the LangGraph saver: a thread's checkpoints of one run deleted (delete_for_runs: "
        "index tombstones, files, latest, writes rewritten), a checkpoint put under a "
        "deleted one's name with its writes, a new thread, another thread deleted",
        _record,
        _resume,
        {
            "listing t": "agrees",
            "listing n": "agrees",
            "listing gone": "agrees",
            "t": "continued",
        },
        setup=_setup,
    ),
    Workload(
        "langgraph-keyed",
        "the langgraph workload in a keyed store (signed checkpoints, head records: the "
        "deletion anchors the head on what it left durable)",
        _record,
        _resume,
        {
            "listing t": "agrees",
            "listing n": "agrees",
            "listing gone": "agrees",
            "t": "continued",
        },
        setup=_setup,
        key="crashsim key",
    ),
)
"""The workloads of the LangGraph saver (only when LangGraph is installed)."""


__all__ = ["LANGGRAPH_WORKLOADS"]
