"""Workloads on a disk that refuses or fails, and on a run another store took.

Each makes a path of the library run that a healthy local disk never takes, so that its
fsyncs are recorded and their site mutants hunted like every other:

- a filesystem that refuses hard links (``EXDEV``, as across mounts or on some network
  and FUSE filesystems): a fork copies the history it would have linked;
- a journal opened for writing for the first time (``effects.log`` made by the open, its
  directory entry fsynced), and one left with a torn tail by a crash mid-append (the
  open cuts it, and fsyncs the cut);
- a journal fsync that fails once with ``EIO``, as a real disk can: the writer cuts the
  file back to its last durable byte, and no crash may bring the failed record back;
- a run fenced on this machine (another store took its lease): the ``fenced`` marker,
  which no power cut may lose, so the run is never written here again.

The faults come from the I/O seam's hook (:func:`afk_local.storage.fsio.set_io_hook`),
which refuses or fails the call as the disk would; the crash is still the explorer's.
A failed fsync is recorded (``fsync-failed``): the model then lets a crash keep any part
of what that fsync covered (:mod:`..model`).
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from afk_local.errors import EffectInDoubtError, LeaseLostError, WriterFailedError
from afk_local.journal.journal import journal_of
from afk_local.storage import fsio
from afk_local.storage.format.frames import encode_frame
from afk_local.storage.rundir.mirror import FENCED_NAME, fenced_reason, mark_fenced
from afk_local.storage.store import Store
from afk_local.testing.crashsim.jobs import one_step_job, perform
from afk_local.testing.crashsim.trace import Session
from afk_local.testing.crashsim.workloads import (
    InDoubt,
    ResumeFailed,
    Workload,
    continue_run,
    continue_runs,
    state_payload,
    write_run,
)


@contextmanager
def faulty_disk(hook: fsio.IoHook) -> Iterator[None]:
    """Install ``hook`` on the process-wide Env (before any hook already there) while the
    block runs: the disk refuses or fails the calls ``hook`` raises for."""
    previous = fsio.DEFAULT_ENV.hook

    def chained(operation: str, path: str) -> None:
        hook(operation, path)
        if previous is not None:
            previous(operation, path)

    fsio.set_io_hook(chained)
    try:
        yield
    finally:
        fsio.set_io_hook(previous)


def refuse_links(operation: str, path: str) -> None:
    """A filesystem without hard links: ``link`` fails with ``EXDEV``."""
    if operation == "link":
        raise OSError(errno.EXDEV, "Invalid cross-device link", path)


def fail_fsync_once(session: Session, name: str) -> Callable[[str, str], None]:
    """A hook whose first fsync of a file called ``name`` fails with ``EIO``, recorded as
    ``fsync-failed`` so that the model knows the disk may have written part of it."""
    failed: list[str] = []

    def hook(operation: str, path: str) -> None:
        if operation != "fsync" or failed or Path(path).name != name:
            return
        failed.append(path)
        session.recorder(fsio.IoCall("fsync-failed", path))
        raise OSError(errno.EIO, "Input/output error", path)

    return hook


# -- fork where links are refused -------------------------------------------------------


def _fork_setup(store: Store, _scratch: Path) -> None:
    write_run(store, "source", 5, effects=4)


def _fork_copied_record(session: Session, _prepared: Any) -> None:
    session.checkpoints_acked("source", since=0)
    session.outcomes_acked("source", since=0)
    with faulty_disk(refuse_links):
        session.store.fork("source", 3, "forked")  # every shared file copied, not linked
    session.checkpoints_acked("forked")
    session.outcomes_acked("forked")
    session.status_acked("forked")


# -- a journal made by its first open -----------------------------------------------------


def _journal_opened_record(session: Session, _prepared: Any) -> None:
    with session.store.create("plain") as run:  # Store.create makes no effects.log
        run.checkpoint("runtime_state", state_payload(0), step=0)
        session.checkpoints_acked("plain")
        journal_of(run).call("send", perform, ("send", 1))  # the open makes effects.log
        session.outcomes_acked("plain", ["send"])
        run.checkpoint("runtime_state", state_payload(1), step=1)
        session.checkpoints_acked("plain")


# -- a journal with a torn tail -----------------------------------------------------------


def _torn_setup(store: Store, _scratch: Path) -> None:
    write_run(store, "run", 3, effects=2)
    with open(store.paths("run").journal, "ab") as journal:  # a crash cut an append short
        journal.write(encode_frame(b"\x93" * 200)[:90])


def _torn_record(session: Session, _prepared: Any) -> None:
    session.checkpoints_acked("run", since=0)
    session.outcomes_acked("run", since=0)
    with session.store.resume_writer("run") as run:  # the open cuts the torn tail
        journal_of(run).call("after", perform, ("after", 9))
        session.outcomes_acked("run", ["after"])
        run.checkpoint("runtime_state", state_payload(3), step=3)
        session.checkpoints_acked("run")


# -- a journal fsync that fails -----------------------------------------------------------


def _eio_record(session: Session, _prepared: Any) -> None:
    with faulty_disk(fail_fsync_once(session, "effects.log")):
        try:
            one_step_job.with_store(session.store).run(7, run_id="eio")
        except WriterFailedError:
            pass
        else:
            raise ResumeFailed("the journal's fsync failed and the job did not say so")
    session.append_failed("eio", "send#1")  # its intent: never read back, so never in doubt


def _eio_resume(store: Store) -> dict[str, Any]:
    try:
        return {"eio": one_step_job.with_store(store).run(7, run_id="eio")}
    except EffectInDoubtError as exc:
        return {"eio": InDoubt(exc.key)}


# -- a fenced run -------------------------------------------------------------------------

_REMOTE = "file:///mirror"
_FENCED_DETAIL = "run run: another store took its lease (epoch 2)"


def _fenced_setup(store: Store, _scratch: Path) -> None:
    write_run(store, "run", 3)  # interrupted: a resume would write it


def _fenced_record(session: Session, _prepared: Any) -> None:
    paths = session.store.paths("run")
    mark_fenced(paths, _REMOTE, _FENCED_DETAIL)  # the mirror found the lease taken
    session.file_kept(paths.dir / FENCED_NAME)  # the run is fenced here, naming its remote


def _fenced_resume(store: Store) -> dict[str, Any]:
    paths = store.paths("run")
    if fenced_reason(paths) is None:  # the mark was lost with the cut: the mirror's next
        mark_fenced(paths, _REMOTE, _FENCED_DETAIL)  # check of the lease fences it again
    try:
        continue_run(store, "run")
    except LeaseLostError:
        return {"run": "fenced"}
    return {"run": "written after it was fenced"}


FAULT_WORKLOADS: tuple[Workload, ...] = (
    Workload(
        "fork-links-refused",
        "fork of a 5-checkpoint run with 4 effects at checkpoint 3 on a filesystem that "
        "refuses hard links (EXDEV): the shared history copied and fsynced",
        _fork_copied_record,
        continue_runs("source", "forked"),
        {"source": "resumed", "forked": "resumed"},
        setup=_fork_setup,
    ),
    Workload(
        "journal-opened",
        "a run made by Store.create (no effects.log) journals its first call: the open "
        "makes effects.log and fsyncs its directory entry, then the intent and outcome",
        _journal_opened_record,
        continue_runs("plain"),
        {"plain": "resumed"},
    ),
    Workload(
        "journal-torn-tail",
        "a run whose effects.log ends in a torn frame (a crash cut an append) reopened for "
        "writing: the tail cut and fsynced, then a journaled call and a checkpoint",
        _torn_record,
        continue_runs("run"),
        {"run": "resumed"},
        setup=_torn_setup,
    ),
    Workload(
        "journal-eio",
        "a one-step job whose journal fsync fails once (EIO): the intent's append raises, "
        "the writer cuts effects.log back to its durable end (fsynced) and the job fails",
        _eio_record,
        _eio_resume,
        {"eio": {"sent": 7}},
    ),
    Workload(
        "fenced",
        "an interrupted run fenced on this machine (another store took its lease): the "
        "fenced marker written durably, so no writer here opens the run again",
        _fenced_record,
        _fenced_resume,
        {"run": "fenced"},
        setup=_fenced_setup,
    ),
)
"""The workloads of a faulty disk and of fencing, in the order the explorer runs them."""


__all__ = ["FAULT_WORKLOADS", "fail_fsync_once", "faulty_disk", "refuse_links"]
