"""Workloads of what afk_local writes outside a store's runs: a new store root, an export
file, the watcher's login service file and its directories, a pulled run.

Each is a person's command: ``afk-local --root NEW pull RUN --from URL`` into a store
that does not exist yet, then ``afk-local export RUN -o FILE`` beside it; the same pull
replacing an older local copy; a pull that takes the run's lease (``--take``);
``afk-local watch --install`` and a watcher's first start.
What each promises after a power cut: a store root a command made stays (with what the
command reported done in it); an export file the command reported written is whole; the
store's id, once a pull used it, stays the same id; a pulled run is the old local copy or
the whole new one; the service file is whole or absent (never a half unit file that
systemd would load), and the watcher starts again.

The command line and the remote extra sit above ``afk_local.testing`` in the layers:
these workloads run ``afk-local`` as a person does, through its installed console script
(:func:`afk_local_cli`), in this process so that its I/O is recorded, never by importing
``afk_local.cli`` or the extra. The pulls read a ``file://`` bucket in the workload's
scratch directory, outside the recorded disk: only the local store's I/O is recorded and
cut. The pulls never write to the bucket (a plain pull, never ``--take``), so it holds
the same objects in every crash state; the push does, and a power cut here never rolls
the bucket back: its resume continues the run locally and leaves the bucket alone.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import io
from pathlib import Path
from typing import Any

from afk_local.journal.journal import journal_of
from afk_local.storage import fsio
from afk_local.storage.store import Store
from afk_local.testing.crashsim.trace import RecordingError, Session
from afk_local.testing.crashsim.workloads import (
    ResumeFailed,
    Workload,
    continue_runs,
    state_payload,
    write_run,
)
from afk_local.watcher.requests import Request, write_request
from afk_local.watcher.service import install
from afk_local.watcher.watcher import Watcher

STORE_ID_FILE = "store.id"
"""The store's owner id, made by the remote extra the first time the store touches a remote
(``afk_local.integrations.remote.identity``)."""

SERVICE_DIR = "systemd-user"
"""Where the service workload installs the unit file: beside the store, recorded."""

_RUN = "far"
"""The run the pull workloads pull (written and pushed by another store, in scratch)."""


def afk_local_cli(*argv: str) -> str:
    """Run ``afk-local ARGV`` in this process, through the installed console script, as a
    person runs it; returns what it printed.

    Raises:
        RecordingError: afk_local is not installed (no ``afk-local`` console script).
        ResumeFailed: the command exited non-zero (its output says why).
    """
    found = importlib.metadata.entry_points(group="console_scripts", name="afk-local")
    if not found:
        raise RecordingError(
            "afk-local is not installed (pip install -e .): the CLI workloads run its console "
            "script in this process"
        )
    main = next(iter(found)).load()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        code = main(list(argv))
    if code != 0:
        raise ResumeFailed(f"afk-local {' '.join(argv)} exited {code}: {printed.getvalue()}")
    return printed.getvalue()


def remote_available() -> bool:
    """True when the remote extra's object-store client (obstore) is installed."""
    return importlib.util.find_spec("obstore") is not None


def _bucket(store: Store) -> str:
    """The scratch bucket: the explorer's scratch directory is beside the recorded base and
    every crash state's (``work/base``, ``work/state``, ``work/again``, ``work/scratch``)."""
    return (store.root.parent.parent / "scratch" / "bucket").as_uri()


def _source(scratch: Path) -> Store:
    return Store(scratch / "source")


def _push(source: Store, url: str) -> None:
    afk_local_cli("--root", str(source.root), "push", _RUN, "--to", url)


def _pull(store: Store) -> str:
    return afk_local_cli("--root", str(store.root), "pull", _RUN, "--from", _bucket(store))


def _new_root_setup(store: Store, scratch: Path) -> None:
    source = _source(scratch)
    write_run(source, _RUN, 4, effects=3)
    _push(source, _bucket(store))


def _new_root_record(session: Session, _prepared: Any) -> None:
    store = session.store
    if store.root.exists():
        raise ResumeFailed(f"{store.root} exists: the workload pulls into a new root")
    _pull(store)  # afk-local --root NEW pull: the root made, the run pulled into it
    session.checkpoints_acked(_RUN)
    session.outcomes_acked(_RUN)
    session.status_acked(_RUN)
    session.file_kept(store.root / STORE_ID_FILE)  # the id the pull used stays the store's
    export = store.root.parent / f"{_RUN}.json"
    afk_local_cli("--root", str(store.root), "export", _RUN, "-o", str(export))
    session.file_kept(export)  # reported written: whole from now on


def _pull_resume(store: Store) -> dict[str, Any]:
    """A new process pulls again (what a person does after a pull cut short: nothing a
    crash left may stand in its way) and reads the run; an export file there, reported
    written or not, is the whole export, never a torn one."""
    _pull(store)
    export = store.root.parent / f"{_RUN}.json"
    if export.exists() and export.read_text("utf-8", "replace") != afk_local_cli(
        "--root", str(store.root), "export", _RUN
    ):
        return {_RUN: f"{export.name} is not the whole export ({export.stat().st_size} bytes)"}
    latest = store.open(_RUN).latest()
    return {_RUN: None if latest is None else latest.seq}


def _replace_setup(store: Store, scratch: Path) -> None:
    source = _source(scratch)
    write_run(source, _RUN, 3, effects=2)
    url = _bucket(store)
    _push(source, url)
    _pull(store)  # an older local copy
    with source.resume_writer(_RUN) as run:  # the run went on elsewhere
        for i in range(3, 5):
            journal_of(run).call(f"later{i}", state_payload, (i,))
            run.checkpoint("runtime_state", state_payload(i), step=i)
    _push(source, url)


def _replace_record(session: Session, _prepared: Any) -> None:
    # what the old copy holds, the new one holds too: binding from before the pull
    session.checkpoints_acked(_RUN, since=0)
    session.outcomes_acked(_RUN, since=0)
    session.file_kept(session.store.root / STORE_ID_FILE)
    _pull(session.store)  # replaces the local copy
    session.checkpoints_acked(_RUN)
    session.outcomes_acked(_RUN)
    session.status_acked(_RUN)


def _push_setup(store: Store, _scratch: Path) -> None:
    write_run(store, _RUN, 3, effects=2)  # a store that never touched a remote


def _push_record(session: Session, _prepared: Any) -> None:
    session.checkpoints_acked(_RUN, since=0)
    _push(session.store, _bucket(session.store))  # the store's id made, the run uploaded
    # The remote names this store's id as the run's holder from now on: a store that
    # came back from a power cut with another id would no longer hold its own run.
    session.file_kept(session.store.root / STORE_ID_FILE)


_KILLED_ID = fsio.TEMP_PREFIX + STORE_ID_FILE + ".killed"
"""The temp file of the id a killed process made (its bytes fsynced, as store_id does)."""


def _killed_id_setup(store: Store, scratch: Path) -> None:
    _push_setup(store, scratch)
    fsio.write_new_file(store.root / _KILLED_ID, b"0123456789abcdef0123456789abcdef\n")


def _killed_id_record(session: Session, _prepared: Any) -> None:
    # The process that made the store's id (identity.store_id) linked it and was killed
    # before its directory fsync: the name is there, not durable.
    root = session.store.root
    fsio.hard_link(root / _KILLED_ID, root / STORE_ID_FILE)
    session.checkpoints_acked(_RUN, since=0)
    _push(session.store, _bucket(session.store))  # uses that id: the remote names it now
    session.file_kept(root / STORE_ID_FILE)


def _take_setup(store: Store, scratch: Path) -> None:
    source = _source(scratch)
    write_run(source, _RUN, 3, effects=2)
    _push(source, _bucket(store))  # epoch 1: the source store holds the run's lease


def _take_record(session: Session, _prepared: Any) -> None:
    store = session.store
    # afk-local pull --take --force into a store that never touched a remote: its id made,
    # the next epoch's lease and bases created in the bucket, the run published here.
    # (--force: the source store's lease has not lapsed; it renews nothing, so no effect
    # of it can repeat.)
    afk_local_cli(
        "--root", str(store.root), "pull", _RUN, "--from", _bucket(store), "--take", "--force"
    )
    session.checkpoints_acked(_RUN)
    session.outcomes_acked(_RUN)
    session.status_acked(_RUN)
    # The bucket names this store's id as the holder now: a power cut that gave the
    # store another id would leave it unable to write its own run.
    session.file_kept(store.root / STORE_ID_FILE)


_UNIT_END = "WantedBy=default.target\n"
"""The last line of every unit file the watcher writes (afk_local.watcher.service)."""


def _service_record(session: Session, _prepared: Any) -> None:
    store = session.store
    if Watcher(store).run_once() != 0:  # a watcher's first start: the store's directories
        raise ResumeFailed("the watcher's first run_once did not exit 0")
    unit = install("systemd", store.root, directory=store.root.parent / SERVICE_DIR)
    session.file_kept(unit)  # afk-local watch --install: the unit file, whole from now on
    asked = write_request(store, Request(kind="resume", run_id="later"))
    session.file_kept(asked)  # filed after the watcher made requests/: it stays


def _service_resume(store: Store) -> dict[str, Any]:
    """Every unit file systemd would load is whole, and the watcher starts again."""
    services = store.root.parent / SERVICE_DIR
    for path in sorted(services.glob("*.service")) if services.is_dir() else []:
        text = path.read_text("utf-8", "replace")
        if not (text.startswith("[Unit]") and text.endswith(_UNIT_END)):
            return {"watcher": f"{path.name} is a half unit file ({len(text)} bytes)"}
    Watcher(store).run_once()  # rejects the request for a run that does not exist
    return {"watcher": "started"}


OUTSIDE_WORKLOADS: tuple[Workload, ...] = (
    Workload(
        "watcher-service",
        "a watcher's first start in a new store (runs/, requests/), afk-local watch "
        "--install systemd (the unit file beside the store), then a request filed",
        _service_record,
        _service_resume,
        {"watcher": "started"},
    ),
)
"""The workloads that need only the core: the watcher's service file and directories."""

REMOTE_WORKLOADS: tuple[Workload, ...] = (
    Workload(
        "pull-new-root",
        "afk-local --root NEW pull of a 4-checkpoint run with 3 effects from a file:// "
        "bucket (the root, store.id and runs/ made), then afk-local export -o beside it",
        _new_root_record,
        _pull_resume,
        {_RUN: 4},
        setup=_new_root_setup,
    ),
    Workload(
        "push",
        "afk-local push of a 3-checkpoint run from a store that never touched a remote "
        "(its store.id made first); a power cut never rolls the bucket back, so the "
        "resume only continues the run locally",
        _push_record,
        continue_runs(_RUN),
        {_RUN: "resumed"},
        setup=_push_setup,
    ),
    Workload(
        "push-killed-id",
        "afk-local push from a store whose id another process linked and was killed "
        "before its directory fsync: the push uses that id, so it must make it durable",
        _killed_id_record,
        continue_runs(_RUN),
        {_RUN: "resumed"},
        setup=_killed_id_setup,
    ),
    Workload(
        "pull-take",
        "afk-local pull --take --force of a 3-checkpoint run with 2 effects into a store "
        "that never touched a remote (its store.id made, the lease moved to it); a power "
        "cut never rolls the bucket back, so the resume only continues the run locally",
        _take_record,
        continue_runs(_RUN),
        {_RUN: "resumed"},
        setup=_take_setup,
    ),
    Workload(
        "pull-replace",
        "afk-local pull of a run whose older local copy (3 checkpoints) it replaces with "
        "the remote's 5",
        _replace_record,
        _pull_resume,
        {_RUN: 5},
        setup=_replace_setup,
    ),
)
"""The workloads of the remote extra (registered when obstore is installed)."""


__all__ = [
    "OUTSIDE_WORKLOADS",
    "REMOTE_WORKLOADS",
    "SERVICE_DIR",
    "STORE_ID_FILE",
    "afk_local_cli",
    "remote_available",
]
