"""Recording a workload: every durable I/O call in order, and what the workload was promised.

A :class:`Recorder` is installed as the I/O recorder of :mod:`afk_local.storage.fsio`
while a workload runs; it turns each call into an :class:`Op` with paths relative
to the recording's base directory. The workload reports, through its
:class:`Session`, what it was promised and when: a checkpoint or an effect
outcome is *acknowledged* once the call that wrote it returned, and from then on
every crash state must hold it. Calls of side-effecting functions are noted too,
so a resume that repeats one can be told apart from a documented in-doubt retry.

Positions count recorded calls: an acknowledgement made when ``n`` calls were
recorded binds every crash after call ``n``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from afk_local.storage import fsio
from afk_local.storage.format.journal_format import read_journal
from afk_local.storage.store import Store
from afk_local.testing.crashsim.disk import is_temporary


class RecordingError(RuntimeError):
    """The recording cannot be trusted (a call outside the base, or a write fsio did not see)."""


@dataclass(frozen=True)
class Op:
    """One recorded durable I/O call; paths are relative to the base, ``/``-separated."""

    index: int
    """1-based position in the trace."""
    operation: str
    path: str
    source: str = ""
    """rename and link: the old path; exchange: the other name; symlink: the link's
    target text."""
    data: bytes = b""
    offset: int = 0
    append: bool = False
    site: str = ""
    """fsync: the afk_local function that asked for it (``packing._write_packs``), as
    :func:`call_site` names it; site mutants remove the fsyncs of one site."""

    def describe(self) -> str:
        """``#12 rename a -> b``: the call as a person reads it."""
        if self.operation in ("rename", "link"):
            return f"#{self.index} {self.operation} {self.source} -> {self.path}"
        if self.operation == "exchange":
            return f"#{self.index} exchange {self.source} <-> {self.path}"
        if self.operation == "symlink":
            return f"#{self.index} symlink {self.path} -> {self.source}"
        if self.operation == "write":
            return f"#{self.index} write {self.path} ({len(self.data)} bytes at {self.offset})"
        if self.operation == "truncate":
            return f"#{self.index} truncate {self.path} to {self.offset} bytes"
        if self.site:
            return f"#{self.index} {self.operation} {self.path} (from {self.site})"
        return f"#{self.index} {self.operation} {self.path}"


@dataclass(frozen=True)
class CheckpointAck:
    """Checkpoint ``seq`` of ``run_id`` was acknowledged with this payload."""

    at: int
    run_id: str
    seq: int
    payload: Any
    until: int | None = None
    """Binds crashes up to (not after) this call: the retention policy let it go there."""


@dataclass(frozen=True)
class OutcomeAck:
    """The outcome of effect ``key`` of ``run_id`` was acknowledged (durable before use)."""

    at: int
    run_id: str
    key: str
    status: str
    result: Any


@dataclass(frozen=True)
class StatusAck:
    """``run.meta`` of ``run_id`` was acknowledged with ``status``, and it stays so."""

    at: int
    run_id: str
    status: str


@dataclass(frozen=True)
class EffectCall:
    """A side-effecting function ran, identified by the idempotency key it was handed."""

    at: int
    idempotency_key: str
    label: str


def run_listing(store: Store, run_id: str) -> frozenset[tuple[str, str]] | None:
    """``(name, sha256)`` of every entry of a run directory but temps and ``owner.lock``;
    None when the run does not exist."""
    run_dir = store.runs_dir / run_id
    if not run_dir.is_dir():
        return None
    found = set()
    for name in os.listdir(run_dir):
        if name == "owner.lock" or is_temporary(name):
            continue
        path = run_dir / name
        data = os.readlink(path).encode() if path.is_symlink() else path.read_bytes()
        found.add((name, hashlib.sha256(data).hexdigest()))
    return frozenset(found)


@dataclass(frozen=True)
class DoneAck:
    """A rewrite of ``run_id`` returned, and stays done: from then on the run directory
    holds exactly ``names`` with these contents (temps and ``owner.lock`` aside), or
    the run stays deleted (``names`` None). What a pack removed does not come back, nor
    a run gc deleted, nor an untrimmed journal: the directory fsyncs that end each
    rewrite exist for this."""

    at: int
    run_id: str
    names: frozenset[tuple[str, str]] | None
    """(name, sha256 of its bytes; of its target for a symlink)"""
    what: str


@dataclass(frozen=True)
class KeptAck:
    """A file kept when its run was removed (``removed/<run>.<time>/run.meta``) is there
    with these bytes from now on, whatever happened to the run."""

    at: int
    path: str
    """Relative to the store's root, ``/``-separated (``../name``: beside the store)."""
    sha256: str
    until: int | None = None
    """Binds crashes up to (not after) this call: the file was let go there (a request
    the watcher handled)."""


@dataclass(frozen=True)
class RemovedAck:
    """``run_id`` is being removed on purpose from call ``at`` on: a crash after that may
    leave it gone, and its other promises bind only while it is there."""

    at: int
    run_id: str


@dataclass(frozen=True)
class MetaAck:
    """A field of ``run_id``'s ``run.meta`` (``attempts``, ``extra.tags``: a dotted path)
    was acknowledged with ``value``, and stays so."""

    at: int
    run_id: str
    field: str
    value: Any


@dataclass(frozen=True)
class GoneAck:
    """The file at ``path`` (relative to the store's root) was removed, and stays gone: a
    schedule a person removed, a request the watcher moved aside."""

    at: int
    path: str


@dataclass(frozen=True)
class MetricsAck:
    """The metric points of ``run_id`` (``MetricLog.to_records()``) were acknowledged, and
    stay readable: gc moves those of the checkpoints it deletes to the run's archive."""

    at: int
    run_id: str
    points: tuple[Any, ...]


def meta_field(meta: Any, dotted: str) -> Any:
    """The value at ``dotted`` (``extra.tags``) of a :class:`RunMeta`; None when absent."""
    value = meta
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else getattr(value, part, None)
    return value


@dataclass(frozen=True)
class UnrecordedAck:
    """An append of ``key``'s record to ``run_id``'s journal raised (its fsync failed), and
    the journal was cut back to what was durable: no record of ``key`` is read back from
    then on (until the run is written again). A record the writer reported as failed and
    a crash then brought back would make a call that never ran look in doubt, or replay
    an outcome the run was told was lost."""

    at: int
    run_id: str
    key: str


@dataclass(frozen=True)
class ClaimAck:
    """A promise the workload states as a check of its own (an integration's view of the
    store: what a new LangGraph saver lists): from call ``at`` on, ``problem(store)``
    returns None, or the sentence saying what is broken."""

    at: int
    what: str
    problem: Callable[[Store], str | None]


Ack = (
    CheckpointAck
    | OutcomeAck
    | StatusAck
    | DoneAck
    | KeptAck
    | RemovedAck
    | MetaAck
    | GoneAck
    | MetricsAck
    | UnrecordedAck
    | ClaimAck
)


_IO_MODULES = frozenset({"afk_local.storage.fsio", __name__})


def call_site() -> str:
    """The innermost afk_local function on the stack outside the I/O seam: ``module.function``.

    ``atomic_write`` called by ``drop_from_packs`` is ``packing.drop_from_packs``: the place
    that decided this fsync was needed, which is what a mutant removes.
    """
    frame = sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.startswith("afk_local.") and module not in _IO_MODULES:
            return f"{module.rpartition('.')[2]}.{frame.f_code.co_name}"
        frame = frame.f_back  # type: ignore[assignment]
    return ""


class Recorder:
    """The I/O recorder installed while a workload runs (thread-safe)."""

    def __init__(self, base: Path) -> None:
        self.base = os.path.abspath(base)
        self.ops: list[Op] = []
        self._lock = threading.Lock()

    def __call__(self, call: fsio.IoCall) -> None:
        with self._lock:
            source = call.source
            if call.operation in ("rename", "link", "exchange"):
                source = self.relative(source)
            self.ops.append(
                Op(
                    index=len(self.ops) + 1,
                    operation=call.operation,
                    path=self.relative(call.path),
                    source=source,
                    data=call.data,
                    offset=call.offset,
                    append=call.append,
                    site=call_site() if call.operation == "fsync" else "",
                )
            )

    def relative(self, path: str) -> str:
        """``path`` relative to the base; RecordingError for anything outside it."""
        if not path:
            raise RecordingError("a durable I/O call without a path cannot be placed on the model")
        full = os.path.normpath(os.path.abspath(path))
        if full == self.base:
            return "."
        if not full.startswith(self.base + os.sep):
            raise RecordingError(f"durable I/O outside the recording's base directory: {full}")
        return full[len(self.base) + 1 :].replace(os.sep, "/")

    def __len__(self) -> int:
        with self._lock:
            return len(self.ops)


@dataclass
class Session:
    """What a workload sees while it is recorded: the store, and where to report promises."""

    base: Path
    store: Store
    recorder: Recorder
    acks: list[Ack] = field(default_factory=list)
    calls: list[EffectCall] = field(default_factory=list)
    _acked: set[tuple[str, str, object]] = field(default_factory=set)

    @property
    def position(self) -> int:
        """How many calls are recorded so far."""
        return len(self.recorder)

    def checkpoints_acked(
        self, run_id: str, upto: int | None = None, *, since: int | None = None
    ) -> None:
        """Checkpoints of ``run_id`` up to seq ``upto`` (default: all on disk) are acknowledged.

        Payloads are read back from the live store, so the check compares with what
        was really written. ``since`` backdates the promise (0: it held before the
        recording started, as for a run that setup wrote).
        """
        at = self.position if since is None else since
        reader = self.store.open(run_id)
        for file in reader.checkpoint_files():
            if (upto is not None and file.seq > upto) or (run_id, "ckpt", file.seq) in self._acked:
                continue
            self._acked.add((run_id, "ckpt", file.seq))
            self.acks.append(CheckpointAck(at, run_id, file.seq, reader.load(file).payload))

    def checkpoints_released(self, run_id: str, *, since: int) -> None:
        """Acknowledged checkpoints of ``run_id`` no longer on disk were let go by the policy.

        Call after the gc that deleted them: they bind only crashes up to ``since`` (the
        position before that gc started), never later ones.
        """
        present = {f.seq for f in self.store.open(run_id).checkpoint_files()}
        for i, ack in enumerate(self.acks):
            if (
                isinstance(ack, CheckpointAck)
                and ack.run_id == run_id
                and ack.seq not in present
                and ack.until is None
            ):
                self.acks[i] = CheckpointAck(ack.at, run_id, ack.seq, ack.payload, until=since)

    def outcomes_acked(
        self, run_id: str, keys: list[str] | None = None, *, since: int | None = None
    ) -> None:
        """The outcomes of ``keys`` (default: every outcome on disk) of ``run_id`` are acknowledged.

        Pass ``keys`` while other threads may be appending: their records may be
        written but not yet durable.
        """
        at = self.position if since is None else since
        records = read_journal(self.store.paths(run_id).journal, run_id, self.store.codec).records
        newest = {r.key: r for r in records if r.kind == "outcome"}
        for key in keys if keys is not None else list(newest):
            if (run_id, "outcome", key) in self._acked:
                continue
            record = newest.get(key)
            if record is None or record.status is None:
                raise RecordingError(f"run {run_id}: no outcome of {key!r} to acknowledge")
            self._acked.add((run_id, "outcome", key))
            self.acks.append(OutcomeAck(at, run_id, key, record.status, record.result))

    def status_acked(self, run_id: str, *, since: int | None = None) -> None:
        """``run_id``'s status in ``run.meta`` now is acknowledged (and final for the recording)."""
        at = self.position if since is None else since
        self.acks.append(StatusAck(at, run_id, self.store.read_meta(run_id).status.value))

    def meta_acked(self, run_id: str, *fields: str) -> None:
        """``fields`` of ``run_id``'s ``run.meta`` (dotted paths) as they are now are
        acknowledged: a :class:`MetaAck` for each."""
        meta = self.store.read_meta(run_id)
        for name in fields:
            self.acks.append(MetaAck(self.position, run_id, name, meta_field(meta, name)))

    def metrics_acked(self, run_id: str, *, since: int | None = None) -> None:
        """Every metric point of ``run_id`` now is acknowledged (a :class:`MetricsAck`)."""
        at = self.position if since is None else since
        points = tuple(self.store.open(run_id).metrics().to_records())
        self.acks.append(MetricsAck(at, run_id, points))

    def file_kept(self, path: Path) -> None:
        """The file at ``path`` (in the recording's base: under the store's root, or beside
        it) holds its bytes of now from now on (a :class:`KeptAck`): a schedule, a mark, a
        request, the store's identity, an export file, a login service file."""
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        self.acks.append(KeptAck(self.position, self._relative(path), digest))

    def _relative(self, path: Path) -> str:
        """``path`` relative to the store's root, ``../name`` for one beside it; a path
        outside the recorded base is a RecordingError (no crash state holds it)."""
        self.recorder.relative(os.fspath(path))
        return Path(os.path.relpath(path, self.store.root)).as_posix()

    def file_released(self, path: Path, *, since: int) -> None:
        """The file at ``path`` was acknowledged (:meth:`file_kept`) and then let go on
        purpose (a handled request): it binds only crashes up to ``since``."""
        relative = self._relative(path)
        for i, ack in enumerate(self.acks):
            if isinstance(ack, KeptAck) and ack.path == relative and ack.until is None:
                self.acks[i] = dataclasses.replace(ack, until=since)

    def file_gone(self, path: Path) -> None:
        """The file at ``path`` (under the store's root) was removed and stays so."""
        self.acks.append(GoneAck(self.position, self._relative(path)))

    def rewrite_done(self, run_id: str, what: str) -> None:
        """``what`` (``gc``, ``pack``) returned for ``run_id``: its result stays (a
        :class:`DoneAck`). Only for a run nothing later in the recording touches."""
        self.acks.append(DoneAck(self.position, run_id, run_listing(self.store, run_id), what))

    def run_removed(self, run_id: str) -> None:
        """``run_id`` is about to be removed on purpose (a :class:`RemovedAck` from now)."""
        self.acks.append(RemovedAck(self.position, run_id))

    def files_kept(self, directory: Path) -> None:
        """Every file in ``directory`` (under the store's root) is kept as it is now: a
        :class:`KeptAck` for each."""
        for path in sorted(directory.iterdir()):
            self.file_kept(path)

    def append_failed(self, run_id: str, key: str) -> None:
        """The append of ``key``'s record to ``run_id``'s journal raised: from now on no
        record of ``key`` is read back (an :class:`UnrecordedAck`)."""
        self.acks.append(UnrecordedAck(self.position, run_id, key))

    def claim_acked(self, what: str, problem: Callable[[Store], str | None]) -> None:
        """``problem(store)`` holds (returns None) in every crash state from now on (a
        :class:`ClaimAck`); ``what`` names the promise in a report."""
        self.acks.append(ClaimAck(self.position, what, problem))

    def effect_called(self, idempotency_key: str, label: str) -> None:
        """A side-effecting function of the workload ran (noted at the current position)."""
        self.calls.append(EffectCall(self.position, idempotency_key, label))


@dataclass(frozen=True)
class Trace:
    """A finished recording: the calls, the promises and the side effects, in order."""

    ops: tuple[Op, ...]
    acks: tuple[Ack, ...]
    calls: tuple[EffectCall, ...]

    def acks_at(self, position: int) -> tuple[Ack, ...]:
        """The acknowledgements that bind a crash after call ``position``."""
        return tuple(
            a
            for a in self.acks
            if a.at <= position
            and (
                not isinstance(a, (CheckpointAck, KeptAck))
                or a.until is None
                or position <= a.until
            )
        )

    def calls_at(self, position: int) -> tuple[EffectCall, ...]:
        """The side effects that may have happened before a crash after call ``position``."""
        return tuple(c for c in self.calls if c.at <= position)


__all__ = [
    "Ack",
    "CheckpointAck",
    "ClaimAck",
    "DoneAck",
    "EffectCall",
    "GoneAck",
    "KeptAck",
    "MetaAck",
    "MetricsAck",
    "Op",
    "OutcomeAck",
    "Recorder",
    "RecordingError",
    "RemovedAck",
    "Session",
    "StatusAck",
    "Trace",
    "UnrecordedAck",
    "meta_field",
    "run_listing",
]
