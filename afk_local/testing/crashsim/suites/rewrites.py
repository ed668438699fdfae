"""Workloads that compose rewrites of a run: packs, merges, gc compaction, a live writer.

Each alone is explored by the ``gc`` and ``pack`` workloads; these put them together
the way a store lives (issue 33): gc of a packed run (a packed checkpoint rewritten as
a keyframe, packs republished without what gc drops), a pack after such a gc, a merge
of several packs, pack and gc interleaved with a writer that packs as it goes, and
fork and export of a run while it is being packed. Every one has a ``rerun``, what a
new process does first after a crash (the interrupted rewrite again), so the explorer
can crash it twice (``depth=2``).

Promises: a checkpoint the policy keeps is acknowledged from before the recording
(``since=0``); one a writer writes is acknowledged when its call returns; one gc lets
go is released (:meth:`~afk_local.testing.crashsim.trace.Session.checkpoints_released`)
from the moment that gc starts.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from afk_local.errors import AfkLocalError
from afk_local.storage.ops.export import export_records
from afk_local.storage.ops.retention import RetentionPolicy
from afk_local.storage.rundir.packing import pack_run
from afk_local.storage.store import Store
from afk_local.testing.crashsim.trace import Session
from afk_local.testing.crashsim.workloads import (
    ResumeFailed,
    Workload,
    continue_run,
    state_payload,
    write_run,
)

KEEP_FOUR = RetentionPolicy(keep_runtime_states=4)
"""The policy of every gc here: the four newest runtime states, and what always stays (of
a packed run of eight, the oldest kept is a delta whose base goes, and two stay packed)."""

_KEY = "crashsim key"


def _acked_before(session: Session, *run_ids: str) -> None:
    """Everything of ``run_ids`` on disk now was there before the recording started."""
    for run_id in run_ids:
        session.checkpoints_acked(run_id, since=0)
        session.outcomes_acked(run_id, since=0)
        session.status_acked(run_id, since=0)


def _gc(session: Session, run_id: str) -> None:
    """gc with :data:`KEEP_FOUR`; what it deletes is released from when it started."""
    started = session.position
    report = session.store.gc(KEEP_FOUR)
    if report.errors:
        raise ResumeFailed(f"gc failed: {report.to_dict()}")
    session.checkpoints_released(run_id, since=started)


def _pack(session: Session, run_id: str, *, full: bool = True) -> None:
    (report,) = session.store.pack([run_id], full=full)
    if report.errors:
        raise ResumeFailed(f"pack failed: {report.to_dict()}")


def _write(session: Session, run_id: str, first: int, count: int) -> None:
    """A writer that packs as it goes (past 2 loose files) writes ``count`` checkpoints."""
    session.store.pack_loose_limit = 2
    with session.store.resume_writer(run_id) as run:
        for i in range(first, first + count):
            run.checkpoint("runtime_state", state_payload(i), step=i)
            session.checkpoints_acked(run_id)


def _packed_run(store: Store, _scratch: Path) -> None:
    """A run of interleaved delta chains, all but its newest file in one pack."""
    write_run(store, "live", 8, effects=3, steps=True)
    store.pack(["live"], full=True)


# -- gc of a packed run ------------------------------------------------------------------


def _gc_packed_record(session: Session, _prepared: Any) -> None:
    _gc(session, "live")
    _acked_before(session, "live")  # what gc kept was there before it started
    reader = session.store.open("live")
    manifest = reader.catalog.manifest()  # the pack's, then gc's: its packs republished
    packed = any(f.pack for f in reader.checkpoint_files())
    if not packed or manifest is None or manifest.generation < 2:
        raise ResumeFailed("gc did not republish the run's packs under a new MANIFEST")
    session.rewrite_done("live", "gc")


def _gc_packed_rerun(session: Session, _prepared: Any) -> None:
    _gc(session, "live")
    _pack(session, "live")


def _half_packed_run(store: Store, _scratch: Path) -> None:
    """A run whose oldest checkpoints are packed and the rest loose: gc dooms loose
    deltas whose bases are doomed packed checkpoints (the rewrite torture's find)."""
    write_run(store, "live", 8, effects=3, steps=True)
    pack_run(store.paths("live"), store.codec, keep_from=13)


# -- gc, then pack, then a writer packing as it goes -------------------------------------


def _gc_then_pack_record(session: Session, _prepared: Any) -> None:
    _gc(session, "live")
    _acked_before(session, "live")
    _pack(session, "live")
    _write(session, "live", 8, 3)


def _gc_then_pack_rerun(session: Session, _prepared: Any) -> None:
    _gc(session, "live")
    _pack(session, "live")
    _write(session, "live", 20, 1)


# -- a merge of several packs ------------------------------------------------------------


def _many_packs(store: Store, _scratch: Path) -> None:
    """A run whose checkpoints sit in two packs (a large old one, a small new one) and
    three loose files: geometric packing left them apart."""
    write_run(store, "idle", 8, effects=1, steps=True)
    step = 8
    for extra in (3, 1, 1):
        pack_run(store.paths("idle"), store.codec, keep_loose=1, full=False)
        with store.resume_writer("idle") as run:
            for j in range(step, step + extra):
                run.checkpoint("step_started", {"state": "running", "message_count": j}, step=j)
                run.checkpoint("runtime_state", state_payload(j), step=j)
        step += extra


def _merge_record(session: Session, _prepared: Any) -> None:
    _acked_before(session, "idle")
    packs = {f.pack for f in session.store.open("idle").checkpoint_files() if f.pack}
    if len(packs) < 2:
        raise ResumeFailed(f"the setup left {len(packs)} pack(s), not several to merge")
    _pack(session, "idle")
    session.rewrite_done("idle", "pack")


def _merge_rerun(session: Session, _prepared: Any) -> None:
    _pack(session, "idle")


# -- pack and gc interleaved with a writer -----------------------------------------------


def _interleaved_record(session: Session, _prepared: Any) -> None:
    session.store.pack_loose_limit = 2
    with session.store.create("live") as run:
        for i in range(4):
            run.checkpoint("step_started", {"state": "running", "message_count": i}, step=i)
            run.checkpoint("runtime_state", state_payload(i), step=i)
            session.checkpoints_acked("live")
    _gc(session, "live")
    _write(session, "live", 4, 3)
    _pack(session, "live", full=False)
    _gc(session, "live")
    _write(session, "live", 7, 1)


def _interleaved_rerun(session: Session, _prepared: Any) -> None:
    if not session.store.exists("live"):
        return  # the first crash came before its first run.meta: nothing to rewrite
    _gc(session, "live")
    _pack(session, "live")


# -- fork and export while a run is packed -----------------------------------------------


def _fork_export_setup(store: Store, _scratch: Path) -> None:
    write_run(store, "source", 4, effects=2)
    store.pack(["source"], full=True)


def _export_whole(store: Store, run_id: str) -> None:
    records = export_records(store.open(run_id))
    if not records:
        raise ResumeFailed(f"export of {run_id} gave nothing")


def _fork_export_record(session: Session, _prepared: Any) -> None:
    _acked_before(session, "source")
    session.store.pack_loose_limit = 2
    with session.store.resume_writer("source") as run:
        for i in range(4, 8):
            run.checkpoint("runtime_state", state_payload(i), step=i)
            session.checkpoints_acked("source")
            _export_whole(session.store, "source")  # lock-free, while the writer packs
            if i == 5:
                session.store.fork("source", 3, "forked")  # a packed seq
                session.checkpoints_acked("forked")
                session.status_acked("forked")


def _fork_export_rerun(session: Session, _prepared: Any) -> None:
    _pack(session, "source")
    session.store.fork("source", 2, "forked-again")
    session.checkpoints_acked("forked-again")


def _fork_export_resume(store: Store) -> dict[str, Any]:
    found = {}
    for run_id in ("source", "forked", "forked-again"):
        if store.exists(run_id):
            _export_whole(store, run_id)
            found[run_id] = continue_run(store, run_id)
    return found


# -- gc of keyframes only, in a keyed store ----------------------------------------------


def _keyframe_run(store: Store, _scratch: Path) -> None:
    """A run of six keyframes: each checkpoint written by a new writer (a resume), so
    gc deletes the oldest with nothing to rewrite and no metrics to archive: the chain
    links in run.meta are the only thing written before the first deletion."""
    with store.create("live") as run:
        run.checkpoint("runtime_state", state_payload(0), step=0)
    for i in range(1, 6):
        with store.resume_writer("live") as run:
            run.checkpoint("runtime_state", state_payload(i), step=i)
    time.sleep(0.003)


def _gc_keyframes_record(session: Session, _prepared: Any) -> None:
    _gc(session, "live")
    _acked_before(session, "live")
    session.rewrite_done("live", "gc")


def _gc_keyframes_rerun(session: Session, _prepared: Any) -> None:
    _gc(session, "live")


# -- gc trims a finished run's journal, then a fork of it ---------------------------------

TRIM_TWO = RetentionPolicy(keep_runtime_states=8, max_effects_per_run=2)
"""Keeps every checkpoint of a finished run of six, and the newest two of its four effects:
a fork at the checkpoint after the second effect (four records: two intents, two
outcomes) then needs the first two."""


def _finished_run(store: Store, _scratch: Path) -> None:
    write_run(store, "done", 6, effects=4, finish="done result")


def _trim_record(session: Session, _prepared: Any) -> None:
    report = session.store.gc(TRIM_TWO)
    if report.errors:
        raise ResumeFailed(f"gc failed: {report.to_dict()}")
    _acked_before(session, "done")
    session.rewrite_done("done", "gc")


def _trim_rerun(session: Session, _prepared: Any) -> None:
    report = session.store.gc(TRIM_TWO)
    if report.errors:
        raise ResumeFailed(f"gc failed: {report.to_dict()}")


def _fork_after_trim(store: Store) -> dict[str, Any]:
    """Fork the finished run where two effects were durable: refused once gc trimmed the
    journal, else the fork holds exactly the first two effects, never two later ones."""
    reader = store.open("done")
    at = next(f for f in reader.checkpoint_files() if reader.load(f).journal_records == 4)
    try:
        store.fork("done", at.seq, "forked")
    except AfkLocalError as error:
        if "trimmed" not in str(error):
            raise
        return {"fork": "consistent"}
    keys = sorted({e.key for e in store.open("forked").effects()})
    if keys != ["e0", "e1"]:
        raise ResumeFailed(f"a fork before gc's trim carries the effects {keys}")
    return {"fork": "consistent"}


def _continue(*run_ids: str) -> Any:
    def resume(store: Store) -> dict[str, Any]:
        return {r: continue_run(store, r) for r in run_ids if store.exists(r)}

    return resume


def _both(name: str, summary: str, **fields: Any) -> tuple[Workload, Workload]:
    """The workload, and its twin in a keyed store (signed packs, chain links)."""
    return (
        Workload(name, summary, **fields),
        Workload(f"{name}-keyed", f"the {name} workload in a keyed store", key=_KEY, **fields),
    )


REWRITE_WORKLOADS: tuple[Workload, ...] = (
    *_both(
        "gc-packed",
        "gc of a packed run: a kept packed delta rewritten as a loose keyframe, its pack "
        "republished without what gc drops; rerun: gc and pack again",
        record=_gc_packed_record,
        resume=_continue("live"),
        expected={"live": "resumed"},
        setup=_packed_run,
        rerun=_gc_packed_rerun,
    ),
    *_both(
        "gc-half-loose",
        "gc of a run packed up to seq 12 and loose after: a doomed loose delta on a doomed "
        "packed base (deleted before the MANIFEST changes); rerun: gc and pack again",
        record=_gc_keyframes_record,
        resume=_continue("live"),
        expected={"live": "resumed"},
        setup=_half_packed_run,
        rerun=_gc_packed_rerun,
    ),
    *_both(
        "gc-then-pack",
        "gc of a packed run, then pack, then a writer packing as it goes (3 checkpoints); "
        "rerun: gc, pack, one more checkpoint",
        record=_gc_then_pack_record,
        resume=_continue("live"),
        expected={"live": "resumed"},
        setup=_packed_run,
        rerun=_gc_then_pack_rerun,
    ),
    Workload(
        "merge",
        "afk-local pack of a run with two packs and loose files: both merged, the loose "
        "ones folded in; "
        "rerun: pack again",
        _merge_record,
        _continue("idle"),
        {"idle": "resumed"},
        setup=_many_packs,
        rerun=_merge_rerun,
    ),
    *_both(
        "live-pack-gc",
        "a writer packing as it goes, gc, the writer again, pack, gc, the writer again "
        "(interleaved in one recording); rerun: gc and pack",
        record=_interleaved_record,
        resume=_continue("live"),
        expected={"live": "resumed"},
        rerun=_interleaved_rerun,
    ),
    Workload(
        "fork-export-packing",
        "a writer packing as it goes while the run is exported after every checkpoint and "
        "forked at a packed checkpoint; rerun: pack, fork again",
        _fork_export_record,
        _fork_export_resume,
        {"source": "resumed", "forked": "resumed", "forked-again": "resumed"},
        setup=_fork_export_setup,
        rerun=_fork_export_rerun,
    ),
    Workload(
        "gc-keyframes-keyed",
        "gc of a keyed run of keyframes: chain links recorded in run.meta, then the "
        "oldest deleted with nothing rewritten; rerun: gc again",
        _gc_keyframes_record,
        _continue("live"),
        {"live": "resumed"},
        setup=_keyframe_run,
        key=_KEY,
        rerun=_gc_keyframes_rerun,
    ),
    Workload(
        "gc-trim-fork",
        "gc trims a finished run's journal (run.meta marked first), then a fork at a "
        "checkpoint whose effects were trimmed; rerun: gc again",
        _trim_record,
        _fork_after_trim,
        {"fork": "consistent"},
        setup=_finished_run,
        rerun=_trim_rerun,
    ),
)
"""The composed workloads, in the order the explorer runs them (after the single ones)."""


__all__ = ["KEEP_FOUR", "REWRITE_WORKLOADS"]
