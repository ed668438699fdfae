"""A watcher's automatic attempts: claims, crash-loop backoff and giving up (docs/watcher.md).

Before it starts a child the watcher *claims* the run under its lock (held for a
few milliseconds): ``watcher_attempts`` + 1 and a lease in ``next_attempt_ms``,
so a second watcher leaves it alone. When the child dies without finishing, the
next attempt waits ``backoff * 2**(n-1)`` seconds; past ``max_attempts`` the run
is marked ``failed`` with the reason. An attempt that wrote a new
``runtime_state`` checkpoint made progress and resets the count.

Every function takes the watcher as an :class:`AttemptHost` and reads its
settings on each decision; :class:`afk_local.watcher.watcher.Watcher` is the host.
"""

from __future__ import annotations

import logging
import os
import re
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import msgspec

from afk_local.errors import AfkLocalError, RunLockedError
from afk_local.storage import fsio
from afk_local.storage.format import codec
from afk_local.storage.format.layout import LOGS_NAME
from afk_local.storage.format.records import Phase, RunMeta, RunStatus, later_ms, now_ms
from afk_local.storage.rundir.ownership import acquire_lock
from afk_local.storage.rundir.read.catalog import RunCatalog
from afk_local.storage.rundir.read.reader import read_meta
from afk_local.storage.rundir.run_changes import tell_meta
from afk_local.storage.store import Store
from afk_local.watcher.wakeups import due_to_wake

log = logging.getLogger("afk_local")

_LOG_TAIL_BYTES = 2000
_ATTEMPT_LOG = re.compile(r"attempt-([0-9]{1,9})\.log")


class AttemptHost(Protocol):
    """What the attempt bookkeeping needs from its watcher."""

    store: Store
    max_attempts: int
    backoff: float
    max_backoff: float
    lease: float

    def emit(self, kind: str, run_id: str | None = None, message: str = "", **fields: Any) -> None:
        """Report an event (see :class:`afk_local.watcher.watcher.WatchEvent`)."""

    def forget(self, run_id: str) -> None:
        """Drop what the host cached about ``run_id``: its ``run.meta`` changed."""


@dataclass(frozen=True)
class Claim:
    """An attempt the watcher took: the claimed ``run.meta`` and the newest seq at that time."""

    meta: RunMeta
    seq_at_start: int


def update_meta_unowned(
    store: Store, run_id: str, change: Callable[[RunMeta], dict[str, Any] | None]
) -> RunMeta | None:
    """Change ``run.meta`` of a run nobody owns, holding its lock for a moment.

    ``change(meta)`` (called with the meta read under the lock) returns the
    fields to replace, or None to leave the run alone. Returns the new meta,
    or None when the lock is held, the run is gone or ``change`` said no.
    """
    paths = store.paths(run_id)
    try:
        lock = acquire_lock(paths, 0.0)
    except (AfkLocalError, OSError):  # locked, or owner.lock damaged (the sweep reports that)
        return None
    try:
        try:
            meta = read_meta(paths, store.codec)
        except AfkLocalError:
            return None
        if store.heads is not None and store.heads.behind(paths, lambda: meta.updated_ms):
            return None  # rolled back: never written on (the trust gate reports it)
        changes = change(meta)
        if changes is None:
            return None
        new = msgspec.structs.replace(meta, updated_ms=later_ms(meta.updated_ms), **changes)
        fsio.atomic_write(paths.meta, codec.encode_meta(store.codec, new))
        tell_meta(paths, new, store.codec.signer)
        if store.heads is not None:
            store.heads.update_meta(run_id, new.updated_ms)
        return new
    finally:
        lock.release()


def claim(host: AttemptHost, run_id: str, *, manual: bool) -> Claim | None:
    """Take the next attempt of ``run_id`` (attempts + 1, lease); None when not ours.

    ``manual`` (a person asked) also takes failed runs and starts the count over.
    A run past ``max_attempts`` is given up instead (see :func:`give_up`).
    """
    stamp = now_ms()
    lease = stamp + int(host.lease * 1000)
    over: list[RunMeta] = []

    paths = host.store.paths(run_id)

    def decide(meta: RunMeta) -> dict[str, Any] | None:
        if meta.entrypoint is None:
            return None
        # The child's writer makes the attempt number meta.attempt + 1; a child that died
        # before it opened the run left a log under its number, so skip past those logs:
        # attempt numbers and their log files never repeat.
        numbering = {"attempt": max(meta.attempt, last_logged_attempt(paths.dir))}
        if manual:  # a person asked: failed runs too, and the count starts over
            if meta.status is RunStatus.COMPLETED:
                return None
            return {"watcher_attempts": 0, "next_attempt_ms": lease, **numbering}
        waking = due_to_wake(meta, stamp)  # a parked run whose sleep is over
        if not (meta.status.expects_owner or waking) or meta.next_attempt_ms > stamp:
            return None
        if meta.watcher_attempts >= host.max_attempts:
            over.append(meta)
            return None
        return {
            "watcher_attempts": meta.watcher_attempts + 1,
            "next_attempt_ms": lease,
            **numbering,
        }

    files = RunCatalog(paths).files() if paths.dir.is_dir() else []
    seq = files[-1].seq if files else 0
    meta = update_meta_unowned(host.store, run_id, decide)
    if meta is None:
        if over:
            give_up(host, run_id, over[0].watcher_attempts, None)
        return None
    return Claim(meta, seq)


def last_logged_attempt(run_dir: Path) -> int:
    """The highest ``n`` of the ``logs/attempt-<n>.log`` files of a run (0: none)."""
    try:
        names = os.listdir(run_dir / LOGS_NAME)
    except OSError:
        return 0
    numbers = [int(m.group(1)) for m in map(_ATTEMPT_LOG.fullmatch, names) if m is not None]
    return max(numbers, default=0)


def attempt_log(run_dir: Path, attempt: int) -> Path:
    """The log file of a watcher-started attempt: ``logs/attempt-<n>.log``."""
    return run_dir / LOGS_NAME / f"attempt-{attempt}.log"


def release(host: AttemptHost, run_id: str, attempts: int) -> None:
    """Hand back the attempt of a child the watcher itself stopped: it does not count."""
    undo = {"watcher_attempts": max(attempts - 1, 0), "next_attempt_ms": 0}
    update_meta_unowned(host.store, run_id, lambda m: undo if m.status.expects_owner else None)


def attempt_died(
    host: AttemptHost,
    run_id: str,
    attempts: int,
    *,
    seq_at_start: int,
    code: int | None,
    log_path: Path,
) -> None:
    """Schedule the next attempt after a child died unfinished, or give up past the limit.

    ``code`` is the child's exit code (negative: killed by that signal), None
    when it did not start; ``log_path`` is its attempt log, quoted in the reason.
    """
    paths = host.store.paths(run_id)
    progressed = any(
        f.seq > seq_at_start and f.phase == Phase.RUNTIME_STATE.value
        for f in RunCatalog(paths).files()
    )
    if progressed:
        attempts = 0
    if attempts >= host.max_attempts:
        give_up(host, run_id, attempts, code, log_path)
        return
    delay = 0.0 if progressed else min(host.backoff * 2 ** max(attempts - 1, 0), host.max_backoff)
    retry = {"watcher_attempts": attempts, "next_attempt_ms": now_ms() + int(delay * 1000)}
    update_meta_unowned(host.store, run_id, lambda m: retry if m.status.expects_owner else None)
    tail = _log_tail(log_path)
    host.emit(
        "backoff",
        run_id,
        f"attempt died ({_describe_exit(code)}); next in {delay:.1f}s"
        + (" (it made progress)" if progressed else "")
        + (f": {tail}" if tail else ""),
        attempt=attempts,
        delay_s=delay,
        exit_code=code,
        log=str(log_path),
    )


def give_up(
    host: AttemptHost, run_id: str, attempts: int, code: int | None, log_path: Path | None = None
) -> None:
    """Mark ``run_id`` failed with the reason the watcher stopped resuming it."""
    tail = _log_tail(log_path) if log_path is not None else ""
    reason = (
        f"the watcher gave up after {attempts} automatic resumes in a row died without "
        f"progress (last: {_describe_exit(code)}"
        + (f", log {log_path}" if log_path else "")
        + (f": {tail}" if tail else "")
        + f"); fix the cause, then `afk-local resume {run_id}`"
    )
    try:
        with host.store.resume_writer(run_id) as writer:
            if not writer.meta.status.expects_owner:
                return
            writer.fail(reason)
            writer.update_meta(
                watcher_attempts=0,
                next_attempt_ms=0,
                extra={**writer.meta.extra, "watcher_gave_up_after": attempts},
            )
    except (RunLockedError, AfkLocalError, OSError) as exc:
        log.warning("watcher: could not mark run %s failed: %s", run_id, exc)
        return
    host.forget(run_id)
    host.emit("gave_up", run_id, reason, attempt=attempts, exit_code=code)


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "did not start"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _log_tail(path: Path | None) -> str:
    """The last non-empty line of an attempt log (bounded read), for reasons."""
    if path is None:
        return ""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(size - _LOG_TAIL_BYTES, 0))
            data = fh.read(_LOG_TAIL_BYTES)
    except OSError:
        return ""
    lines = [
        line.strip()
        for line in data.decode("utf-8", "replace").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    return lines[-1][:300] if lines else ""


__all__: Sequence[str] = [
    "AttemptHost",
    "Claim",
    "attempt_died",
    "attempt_log",
    "claim",
    "give_up",
    "last_logged_attempt",
    "release",
    "update_meta_unowned",
]
