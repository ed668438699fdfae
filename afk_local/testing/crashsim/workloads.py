"""The workloads the explorer records, and how each continues after a crash.

A :class:`Workload` has three parts:

- ``setup(store, scratch)``: runs before the recording; what it leaves in the
  store counts as durable (it stands for work done long before). It returns
  anything ``record`` needs (an export's text, say).
- ``record(session, prepared)``: the recorded part. It runs real afk_local code
  against ``session.store`` and reports every promise it got (see
  :class:`~afk_local.testing.crashsim.trace.Session`): the explorer holds every
  crash state to those.
- ``resume(store)``: in a crash state, continue as a new process would (run the
  job again, or reopen each run for writing and checkpoint once) and return
  ``{run_id: outcome}`` for the runs it found; ``expected`` says what each
  outcome must be.

Adding one (the ``pack`` workloads are the newest): write the three functions, give the expected
outcomes, add the :class:`Workload` to :data:`BASIC_WORKLOADS` (or, composing rewrites, to
:data:`~afk_local.testing.crashsim.suites.rewrites.REWRITE_WORKLOADS`). The explorer, the
command line and the tests pick it up by name; docs/guarantees.md lists the
state counts per workload.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from afk_local.errors import EffectInDoubtError, UntrustedStoreError
from afk_local.journal.journal import journal_of
from afk_local.runner.run.durable_function import DurableFunction
from afk_local.storage.ops.export import export_records, import_run, to_jsonable
from afk_local.storage.ops.retention import RetentionPolicy
from afk_local.storage.rundir.packing import pack_run
from afk_local.storage.store import Store
from afk_local.storage.store_identity import adopt_identity, home_problem
from afk_local.testing.crashsim.jobs import (
    PADDING,
    batch_job,
    count_job,
    count_job_at_exit,
    ledger_job,
    one_step_job,
)
from afk_local.testing.crashsim.trace import Session

HEADS_DIR = "heads"
"""Where a workload's keyed store keeps its head records: beside the store, recorded."""


class ResumeFailed(AssertionError):
    """A run could be reopened but did not continue as it should."""


@dataclass(frozen=True)
class InDoubt:
    """The outcome of a resume that stopped at an effect in doubt (``EffectInDoubtError``)."""

    key: str


@dataclass(frozen=True)
class Workload:
    """One scenario to record and crash; see the module docstring."""

    name: str
    summary: str
    record: Callable[[Session, Any], None]
    resume: Callable[[Store], dict[str, Any]]
    expected: dict[str, Any]
    setup: Callable[[Store, Path], Any] = field(default=lambda store, scratch: None)
    key: str | None = None
    """A store key: the workload runs, and is checked, in a keyed (signed) store."""
    rerun: Callable[[Session, Any], None] | None = None
    """Crashing twice: what a new process does first in a crash state (the interrupted
    operation again: gc after a killed gc), recorded and crashed in turn. It reports the
    promises it gets, like ``record``; those of the first recording still bind."""
    at_home: bool = True
    """Re-home each crash state before its check (see :func:`_take_home`); False for a
    workload whose promise is about the store's identity itself (adopt)."""

    def store(self, root: Path) -> Store:
        """The workload's store at ``root``.

        A keyed store's head records (kept outside the store, never fsynced) go next to
        it, in ``heads/`` of the directory that holds it: their writes are recorded too,
        so each crash state holds the head records a crash may leave there (behind the
        run or cut short, never ahead of it, which is what the check holds them to).
        """
        store = Store(root, key=self.key, head_dir=root.parent / HEADS_DIR)
        if store.heads is not None:
            _take_heads(root.parent / HEADS_DIR, store.heads.dir)
        if self.at_home:
            _take_home(store)
        return store


def _take_home(store: Store) -> None:
    """A crash state is the recorded store after a crash, at the path it had: its
    identity names the recording's path, which a new process there would see as home.
    Re-home it (as ``afk-local adopt`` would) so that the moved-store refusal does not
    stand in for what the crash left; a damaged identity is left for the check."""
    try:
        moved = home_problem(store.root, store.codec.signer)
    except UntrustedStoreError:
        return
    if moved is not None:
        adopt_identity(store.root, store.codec.signer)


def _take_heads(heads: Path, own: Path) -> None:
    """Give the head records recorded for this store at another path (a crash state is
    built elsewhere than the store was recorded in, and a head directory is named after
    its store's real path) to the store at ``own``."""
    if own.is_dir() or not heads.is_dir():
        return
    recorded = [p for p in heads.iterdir() if p.is_dir() and not p.is_symlink()]
    if len(recorded) == 1:
        recorded[0].rename(own)


def _job_workload(
    name: str, summary: str, job: DurableFunction[Any], args: tuple[Any, ...], result: Any
) -> Workload:
    run_id = name

    def record(session: Session, _prepared: Any) -> None:
        done = job.with_store(session.store).run(*args, run_id=run_id)
        session.checkpoints_acked(run_id)  # the terminal checkpoint too
        session.status_acked(run_id)  # completed: a resume must not run it again
        if done != result:
            raise ResumeFailed(f"the recorded run returned {done!r}, not {result!r}")

    def resume(store: Store) -> dict[str, Any]:
        try:
            return {run_id: job.with_store(store).run(*args, run_id=run_id)}
        except EffectInDoubtError as exc:
            return {run_id: InDoubt(exc.key)}

    return Workload(name, summary, record, resume, {run_id: result})


def continue_run(store: Store, run_id: str) -> Any:
    """Resume a run as a new writer would: a completed run gives its result; any other is
    reopened (stray temps removed, the journal's torn tail repaired) and checkpointed once."""
    state = store.open(run_id).resume_state()
    if state.terminal:
        return {"completed": state.result}
    with store.resume_writer(run_id) as run:
        len(run.effects)  # opening the journal for writing repairs a torn tail
        written = run.checkpoint("runtime_state", {"resumed_after": state.latest_seq}, step=0)
    latest = store.open(run_id).latest()
    if latest is None or latest.seq != written.seq:
        raise ResumeFailed(
            f"run {run_id}: wrote checkpoint {written.seq}, latest is "
            f"{None if latest is None else latest.seq}"
        )
    return "resumed"


def continue_runs(*run_ids: str) -> Callable[[Store], dict[str, Any]]:
    """A ``resume`` that continues each of ``run_ids`` that exists (:func:`continue_run`)."""

    def resume(store: Store) -> dict[str, Any]:
        return {r: continue_run(store, r) for r in run_ids if store.exists(r)}

    return resume


def state_payload(i: int) -> dict[str, Any]:
    return {"i": i, "log": [f"line {j} " * 12 for j in range(i + 1)]}


def _value(i: int) -> dict[str, Any]:
    return {"i": i, "padding": PADDING}


def write_run(
    store: Store,
    run_id: str,
    checkpoints: int,
    *,
    effects: int = 0,
    finish: Any = None,
    steps: bool = False,
) -> None:
    """A run written before the recording: runtime_state deltas, some journaled calls, and
    with ``steps`` a ``step_started`` before each (two delta chains, interleaved)."""
    with store.create(run_id) as run:
        for i in range(checkpoints):
            if i < effects:
                journal_of(run).call(f"e{i}", _value, (i,))
            if steps:
                run.checkpoint("step_started", {"state": "running", "message_count": i}, step=i)
            run.checkpoint("runtime_state", state_payload(i), step=i)
        if finish is not None:
            run.finish(finish)
    time.sleep(0.003)  # distinct updated_ms: gc's age order is then deterministic


# -- create ------------------------------------------------------------------------------


def _create_record(session: Session, _prepared: Any) -> None:
    session.store.create("made").close()
    session.status_acked("made")  # created: the run exists from here on
    with session.store.create("first", publish_with_first_write=True) as run:
        run.checkpoint("runtime_state", state_payload(0), step=0)  # published with it
    session.checkpoints_acked("first")
    done = one_step_job.with_store(session.store).run(7, run_id="job")
    session.checkpoints_acked("job")  # the terminal checkpoint (the run has no other)
    session.status_acked("job")  # completed: a resume must not run it again
    if done != {"sent": 7}:
        raise ResumeFailed(f"the recorded run returned {done!r}")


def _create_rerun(session: Session, _prepared: Any) -> None:
    """A new process after the crash: makes the run that is missing, runs the job again."""
    store = session.store
    if not store.exists("made"):
        store.create("made").close()
        session.status_acked("made")
    try:
        one_step_job.with_store(store).run(7, run_id="job")
    except EffectInDoubtError:
        return  # the send really is in doubt: the resume after this crash says so again
    session.checkpoints_acked("job")
    session.status_acked("job")


def _create_resume(store: Store) -> dict[str, Any]:
    outcomes: dict[str, Any] = {}
    for run_id in ("made", "first"):
        if store.exists(run_id):
            outcomes[run_id] = continue_run(store, run_id)
    try:
        outcomes["job"] = one_step_job.with_store(store).run(7, run_id="job")
    except EffectInDoubtError as exc:
        outcomes["job"] = InDoubt(exc.key)
    return outcomes


# -- gc ---------------------------------------------------------------------------------

GC_POLICY = RetentionPolicy(keep_runtime_states=2, max_effects_per_run=2, max_runs=2)


def _gc_setup(store: Store, _scratch: Path) -> None:
    write_run(store, "old", 3, finish="old result")  # the oldest terminal run: deleted
    write_run(store, "done", 6, effects=4, finish="done result")  # compacted, journal trimmed
    write_run(store, "live", 5, effects=3, steps=True)  # interrupted: compacted, kept deltas
    # rewritten; its step_started and runtime_state chains interleave


def _gc_record(session: Session, _prepared: Any) -> None:
    report = session.store.gc(GC_POLICY)
    if report.errors or report.deleted_runs != ["old"]:
        raise ResumeFailed(f"gc did not do what the workload expects: {report.to_dict()}")
    for run_id in ("done", "live"):  # what gc keeps was there before it started
        session.checkpoints_acked(run_id, since=0)
        session.outcomes_acked(run_id, since=0)
        session.status_acked(run_id, since=0)
    for run_id in ("old", "done", "live"):  # and what it did stays done
        session.rewrite_done(run_id, "gc")


# -- pack -------------------------------------------------------------------------------


def _pack_setup(store: Store, _scratch: Path) -> None:
    # Two interleaved delta chains and a few effects; the oldest checkpoints already
    # packed, so the recorded pack merges that pack with the files after it.
    write_run(store, "idle", 5, effects=2, steps=True)
    pack_run(store.paths("idle"), store.codec, keep_from=5)


def _pack_record(session: Session, _prepared: Any) -> None:
    for run_id in ("idle",):  # what the pack folds was there before it started
        session.checkpoints_acked(run_id, since=0)
        session.outcomes_acked(run_id, since=0)
        session.status_acked(run_id, since=0)
    (report,) = session.store.pack(["idle"])
    if report.errors or not report.packs_merged or report.loose_left != 1:
        raise ResumeFailed(f"pack did not do what the workload expects: {report.to_dict()}")
    session.rewrite_done("idle", "pack")
    # A live writer past its loose-file limit packs by itself, acknowledging on the way.
    session.store.pack_loose_limit = 3
    with session.store.create("live") as run:
        for i in range(6):
            run.checkpoint("runtime_state", state_payload(i), step=i)
            session.checkpoints_acked("live")


# -- fork -------------------------------------------------------------------------------


def _fork_setup(store: Store, _scratch: Path) -> None:
    write_run(store, "source", 5, effects=4)


def _fork_record(session: Session, _prepared: Any) -> None:
    session.checkpoints_acked("source", since=0)  # a fork leaves its source alone
    session.outcomes_acked("source", since=0)
    session.status_acked("source", since=0)
    session.store.fork("source", 3, "forked")
    session.checkpoints_acked("forked")
    session.outcomes_acked("forked")
    session.status_acked("forked")


# -- import -----------------------------------------------------------------------------


def _import_setup(_store: Store, scratch: Path) -> str:
    source = Store(scratch / "exporting-store")
    write_run(source, "exported", 5, effects=3)
    records = export_records(source.open("exported"))
    return "\n".join(json.dumps(to_jsonable(r)) for r in records)


def _import_record(session: Session, text: str) -> None:
    import_run(session.store, text, new_run_id="imported", source="crashsim export")
    session.checkpoints_acked("imported")
    session.outcomes_acked("imported")
    session.status_acked("imported")


BASIC_WORKLOADS: tuple[Workload, ...] = (
    _job_workload(
        "sync",
        "a sync job: 6 checkpoints of a growing state (deltas), then its result",
        count_job,
        (6,),
        {"count": 6},
    ),
    _job_workload(
        "async",
        "an async job: queued checkpoints while 3 threads journal calls (group commit), "
        "two flushes, its result",
        batch_job,
        (2, 3),
        {"fetched": [0, 1, 2, 3, 4, 5], "done": 6},
    ),
    _job_workload(
        "exit",
        "an exit-mode job: 4 checkpoints kept in memory, written with its result",
        count_job_at_exit,
        (4,),
        {"count": 4},
    ),
    _job_workload(
        "journal",
        "journaled calls: not idempotent, idempotent, one that fails; checkpoints between",
        ledger_job,
        (),
        {"charged": 1, "mailed": 2, "notified": 3},
    ),
    Workload(
        "create",
        "Store.create of a run, one published with its first checkpoint, then a one-step "
        "sync job's new run (published before its body), its intent, outcome and result "
        "(its completed run.meta never fsynced)",
        _create_record,
        _create_resume,
        {"made": "resumed", "first": "resumed", "job": {"sent": 7}},
        rerun=_create_rerun,
    ),
    Workload(
        "gc",
        "gc of three runs: one deleted (max_runs), a finished one compacted and its "
        "journal trimmed, an interrupted one compacted (deltas rewritten as keyframes)",
        _gc_record,
        continue_runs("done", "live"),
        {"done": {"completed": "done result"}, "live": "resumed"},
        setup=_gc_setup,
    ),
    Workload(
        "gc-keyed",
        "the gc workload in a keyed store (signature chains, chain links in run.meta)",
        _gc_record,
        continue_runs("done", "live"),
        {"done": {"completed": "done result"}, "live": "resumed"},
        setup=_gc_setup,
        key="crashsim key",
    ),
    Workload(
        "pack",
        "afk-local pack of an idle run (an older pack merged, every file but the newest "
        "folded in), then a live writer packing by itself past 3 loose files",
        _pack_record,
        continue_runs("idle", "live"),
        {"idle": "resumed", "live": "resumed"},
        setup=_pack_setup,
    ),
    Workload(
        "pack-keyed",
        "the pack workload in a keyed store (signed packs, signature chains across them)",
        _pack_record,
        continue_runs("idle", "live"),
        {"idle": "resumed", "live": "resumed"},
        setup=_pack_setup,
        key="crashsim key",
    ),
    Workload(
        "fork",
        "fork of a 5-checkpoint run with 4 effects at checkpoint 3",
        _fork_record,
        continue_runs("source", "forked"),
        {"source": "resumed", "forked": "resumed"},
        setup=_fork_setup,
    ),
    Workload(
        "import",
        "import of an exported 5-checkpoint run with 3 effects",
        _import_record,
        continue_runs("imported"),
        {"imported": "resumed"},
        setup=_import_setup,
    ),
)
"""The workloads of one operation each (jobs, gc, pack, fork, import); the registry
(:data:`~afk_local.testing.crashsim.registry.WORKLOADS`) adds the composed ones."""


__all__ = [
    "BASIC_WORKLOADS",
    "HEADS_DIR",
    "InDoubt",
    "ResumeFailed",
    "Workload",
    "continue_run",
    "continue_runs",
    "state_payload",
    "write_run",
]
