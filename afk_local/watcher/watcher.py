"""The watcher: finds interrupted runs and resumes them, also after a reboot (docs/watcher.md).

A run is *interrupted* when its status is ``running`` (or ``created``) and nobody
holds its ``owner.lock`` (the one definition:
:func:`~afk_local.storage.rundir.ownership.is_interrupted`); the lock is the truth,
whatever ``run.meta`` says about the owner (a run from an earlier boot with a free
lock is interrupted, a run whose lock is held is never touched). :class:`Watcher`
sweeps the store, then watches ``runs/`` and ``requests/`` with watchfiles and sweeps
again on a timer (a dying process makes no filesystem event). Every resume is a child process,
``python -m afk_local resume RUN``, that takes the lock itself; its output goes
to ``runs/<id>/logs/attempt-<n>.log``.

Crash loops: every automatic resume is an *attempt*, claimed under the run's lock
with a lease, backed off after each death without progress and given up past
``max_attempts`` (see :mod:`afk_local.watcher.attempts`).

Example:
    >>> from afk_local.watcher.watcher import Watcher  # doctest: +SKIP
    >>> Watcher(afk.Store("~/.afk")).run_once()  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from afk_local.clock import child_clock_env
from afk_local.errors import (
    AfkLocalError,
    CheckpointCorruptionError,
    SchemaVersionError,
    UntrustedStoreError,
)
from afk_local.runner.code.origin import cannot_resume, reentry_plan
from afk_local.storage import fsio
from afk_local.storage.format.integrity import KEY_ENV
from afk_local.storage.format.records import RunMeta, RunStatus, now_ms
from afk_local.storage.meta_index import UNREADABLE
from afk_local.storage.rundir.mirror import fenced_reason
from afk_local.storage.rundir.options import MAX_RECORD_BYTES_ENV
from afk_local.storage.rundir.ownership import boot_id, is_interrupted, probe_owner
from afk_local.storage.rundir.read.heads import HEAD_DIR_ENV
from afk_local.storage.rundir.read.reader import read_meta
from afk_local.storage.store import Store
from afk_local.storage.trust import path_problem, require_trusted_run, store_problems
from afk_local.watcher.attempts import (
    attempt_died,
    attempt_log,
    claim,
    release,
    update_meta_unowned,
)
from afk_local.watcher.requests import process_requests
from afk_local.watcher.schedules import Scheduler
from afk_local.watcher.wakeups import due_to_wake, wake_time_text

log = logging.getLogger("afk_local")

LOCKED_EXIT = 75
"""Exit code of ``afk-local resume`` when another process holds the run (EX_TEMPFAIL)."""


@dataclass(frozen=True)
class WatchEvent:
    """One thing the watcher did: printed as a line, or as JSON with ``--json``.

    ``kind`` is one of ``started``, ``resumed``, ``completed``, ``paused``,
    ``failed``, ``sleeping`` (parked in a long ``ctx.sleep``), ``scheduled`` (a schedule's
    slot got its run), ``backoff``, ``gave_up``,
    ``stopped``, ``taken`` (another
    process holds the run), ``skipped`` (an interrupted run no process can resume, or
    whose ``run.meta`` cannot be read, e.g. a newer schema version; said once),
    ``damaged`` (its ``owner.lock`` is not a lock: left for a person), ``refused``
    (the trust gate refused the run: nothing was started; said once per change of
    the run), ``submitted``, ``request``, ``rejected``, ``stopping``.
    """

    kind: str
    run_id: str | None = None
    message: str = ""
    attempt: int = 0
    delay_s: float | None = None
    exit_code: int | None = None
    log: str | None = None
    ts_ms: int = field(default_factory=now_ms)

    def to_dict(self) -> dict[str, Any]:
        """The event as a JSON-able dict (None fields left out)."""
        out = {
            "event": self.kind,
            "run_id": self.run_id,
            "message": self.message,
            "attempt": self.attempt,
            "delay_s": self.delay_s,
            "exit_code": self.exit_code,
            "log": self.log,
            "ts_ms": self.ts_ms,
        }
        return {k: v for k, v in out.items() if v is not None}


@dataclass
class _Child:
    run_id: str
    proc: subprocess.Popen[bytes]
    attempt: int
    seq_at_start: int
    log_path: Path
    started: float


@dataclass
class _Cached:
    key: tuple[int, int, int]
    meta: RunMeta


def _child_key_env(store: Store) -> dict[str, str]:
    """The environment that gives a keyed store's key to the children that resume its runs.

    ``$AFK_LOCAL_KEY``, as ``afk-local watch`` passes it (its children inherit it):
    the environment of a process is readable only by its user, never on a command
    line or in a file. Empty for a store without a key.

    Raises:
        ValueError: a ``bytes`` key that is not UTF-8 text without NUL cannot travel
            in the environment; give the key as text.
    """
    key = store.options.key
    if key is None:
        return {}
    if isinstance(key, bytes):
        try:
            key = key.decode()
        except UnicodeDecodeError:
            key = "\0"  # refused below
    if "\0" in key:
        raise ValueError(
            f"the watcher hands the store's key to its children in ${KEY_ENV}, which cannot "
            "hold this key (not UTF-8 text, or it holds NUL): use a text key"
        )
    return {KEY_ENV: key}


class Watcher:
    """Resumes the interrupted runs of one store, each in a child process.

    Args:
        store: the store to watch.
        concurrency: at most this many children at once.
        max_attempts: consecutive automatic resumes without progress before the
            run is marked ``failed``.
        interval: seconds between timer sweeps.
        backoff: seconds before the 2nd attempt; doubles for every further one.
        max_backoff: the longest wait between two attempts.
        grace: seconds children get to checkpoint and exit on stop, before SIGKILL.
        lease: seconds a claim keeps other watchers off a run whose child has not
            taken the lock yet.
        on_event: called with every :class:`WatchEvent` (from the watcher's thread).
        python: the interpreter children run under when the run records none (or the
            recorded one is gone); a run's own interpreter, recorded where its job
            ran, comes first (:func:`afk_local.runner.code.origin.reentry_plan`).
        env: extra environment for children.
    """

    def __init__(
        self,
        store: Store,
        *,
        concurrency: int = 4,
        max_attempts: int = 5,
        interval: float = 2.0,
        backoff: float = 5.0,
        max_backoff: float = 900.0,
        grace: float = 10.0,
        lease: float = 60.0,
        on_event: Callable[[WatchEvent], None] | None = None,
        python: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        if interval <= 0:
            raise ValueError("interval must be > 0 seconds")
        self.store = store
        self.concurrency = concurrency
        self.max_attempts = max_attempts
        self.interval = interval
        self.backoff = max(backoff, 0.0)
        self.max_backoff = max(max_backoff, self.backoff)
        self.grace = grace
        self.lease = lease
        self.on_event = on_event
        self.python = python or sys.executable
        self.env = env or {}
        self._key_env = _child_key_env(store)
        self.children: dict[str, _Child] = {}
        self.pending: deque[str] = deque()
        self.stop_event = threading.Event()
        self.counts: dict[str, int] = {}
        self._cache: dict[str, _Cached] = {}
        self._skipped: dict[str, str] = {}  # run id -> why it cannot be resumed (said once)
        self._damaged: dict[str, str] = {}  # run id -> the lock problem already reported
        self._reported: dict[str, tuple[int, ...]] = {}  # refused/skipped, by _state_key
        self._stopping = False
        self.scheduler = Scheduler(self)

    def __repr__(self) -> str:
        return f"Watcher(root={str(self.store.root)!r}, children={len(self.children)})"

    # -- events -------------------------------------------------------------------

    def emit(self, kind: str, run_id: str | None = None, message: str = "", **fields: Any) -> None:
        """Record an event: count it, log it, hand it to ``on_event``."""
        event = WatchEvent(kind, run_id, message, **fields)
        self.counts[kind] = self.counts.get(kind, 0) + 1
        log.info("watcher: %s %s %s", kind, run_id or "", message)
        if self.on_event is not None:
            self.on_event(event)

    # -- finding interrupted runs ---------------------------------------------------

    def _meta(self, run_id: str) -> RunMeta | None:
        """``run.meta`` of a run, decoded only when its file changed since the last sweep."""
        paths = self.store.paths(run_id)
        try:
            st = os.stat(paths.meta, follow_symlinks=False)
        except OSError:
            self._cache.pop(run_id, None)
            return None
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        cached = self._cache.get(run_id)
        if cached is not None and cached.key == key:
            return cached.meta
        reported = self._reported.get(run_id)
        if reported is not None and reported == self._state_key(run_id):
            return None  # refused or unreadable, and unchanged since: said so already
        try:
            meta = read_meta(paths, self.store.codec)
        except (SchemaVersionError, CheckpointCorruptionError) as exc:
            # A newer schema, or damaged (keyed: unsigned) meta: said once, left alone.
            self._cache.pop(run_id, None)
            self._report(run_id, "skipped", f"{exc}; the watcher leaves it alone")
            return None
        except AfkLocalError:
            self._cache.pop(run_id, None)
            return None
        self._cache[run_id] = _Cached(key, meta)
        return meta

    def forget(self, run_id: str) -> None:
        """Drop the cached ``run.meta`` of ``run_id``: it changed (or is about to)."""
        self._cache.pop(run_id, None)

    def _report(self, run_id: str, kind: str, message: str) -> None:
        self._reported[run_id] = self._state_key(run_id)
        self.emit(kind, run_id, message)

    def _state_key(self, run_id: str) -> tuple[int, ...]:
        """What must change for a refused run to be looked at again: its ``run.meta``
        (``--trust``, a new attempt) or its directory (``chmod``, ``chown``)."""
        paths = self.store.paths(run_id)
        key: list[int] = []
        for path in (paths.meta, paths.dir):
            try:
                st = os.stat(path, follow_symlinks=False)
                key += [st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_mode]
            except OSError:
                key += [0, 0, 0, 0, 0]
        return tuple(key)

    def _trusted(self, run_id: str) -> bool:
        """Run the trust gate on ``run_id`` before starting anything for it.

        A refusal is reported once (per version of the run's meta) and the run is
        left alone; the watcher goes on with the others.
        """
        try:
            require_trusted_run(self.store, run_id, from_origin=True)
            self._logs_dir(run_id)
        except (AfkLocalError, OSError) as exc:
            self.forget(run_id)
            self._report(run_id, "refused", f"nothing started: {exc}")
            return False
        return True

    def interrupted(self, now: int | None = None) -> list[str]:
        """Runs a watcher should resume now: interrupted, resumable, not backing off.

        A run without an entrypoint (not an ``@afk.durable`` job nor an agent run
        with a rebuildable agent: a StateCheckpoint, a LangGraph thread, a
        subagent's child run) has nothing to re-import and is left alone; so is
        every run whose lock is held, and every run whose ``owner.lock`` is damaged
        (reported once as a ``damaged`` event; the sweep goes on with the others).
        """
        stamp = now_ms() if now is None else now
        found = []
        # The store's meta index says, with a stat per run, which metas may need a look:
        # a run that needs no owner and is not sleeping, or has no entrypoint, is never
        # decoded here.
        sleeping = RunStatus.SLEEPING.value
        candidates = sorted(
            run_id
            for run_id, summary in self.store.meta_index().summaries().items()
            if run_id not in self.children
            and (
                summary.status == UNREADABLE
                or (
                    (summary.expects_owner or summary.status == sleeping)
                    and summary.entrypoint
                    and summary.next_attempt_ms <= stamp
                )
            )
        )
        for run_id in candidates:
            meta = self._meta(run_id)
            if meta is None or meta.entrypoint is None:
                continue
            waking = due_to_wake(meta, stamp)  # a parked run whose ctx.sleep is over
            if not (meta.status.expects_owner or waking) or meta.next_attempt_ms > stamp:
                continue
            owner = probe_owner(self.store.paths(run_id).lock)
            if owner.problem is not None:
                self._report_damage(run_id, owner.problem)
                continue
            self._damaged.pop(run_id, None)
            if not (is_interrupted(meta.status, owner) or (waking and not owner.held)):
                continue
            reason = cannot_resume(meta) or fenced_reason(self.store.paths(run_id))
            if reason is not None:  # knowable now: no doomed attempts, never marked failed
                if self._skipped.get(run_id) != reason:
                    self._skipped[run_id] = reason
                    self.emit("skipped", run_id, f"cannot be resumed: {reason}")
                continue
            self._skipped.pop(run_id, None)
            found.append(run_id)
        return found

    def _report_damage(self, run_id: str, problem: str) -> None:
        if self._damaged.get(run_id) == problem:
            return  # said already; a person has to act
        self._damaged[run_id] = problem
        self.emit(
            "damaged",
            run_id,
            f"{problem}: not resumed; remove it once no process uses the run "
            f"(`afk-local verify {run_id}`)",
        )

    def sweep(self) -> list[str]:
        """Start due schedule slots, then queue every interrupted run (once); returns them."""
        self.scheduler.start_due_runs()  # as `created` runs, which the sweep below finds
        found = self.interrupted()
        queued = set(self.pending)
        for run_id in found:
            if run_id not in queued:
                self.pending.append(run_id)
        return found

    # -- claiming and starting ---------------------------------------------------------

    def update_meta_unowned(
        self, run_id: str, change: Callable[[RunMeta], dict[str, Any] | None]
    ) -> RunMeta | None:
        """Change ``run.meta`` of a run nobody owns, holding its lock for a moment.

        See :func:`afk_local.watcher.attempts.update_meta_unowned`.
        """
        return update_meta_unowned(self.store, run_id, change)

    def _logs_dir(self, run_id: str) -> Path:
        """``runs/<id>/logs``, made if missing; a symlink or non-directory there is refused."""
        logs = attempt_log(self.store.paths(run_id).dir, 1).parent
        problem = path_problem(logs, directory=True)
        if problem is not None:
            raise UntrustedStoreError(
                str(logs), problem, "remove it; the watcher writes attempt logs there", run_id
            )
        fsio.make_dir(logs, exist_ok=True)
        return logs

    def _open_log(self, run_id: str, attempt: int) -> tuple[int, Path]:
        path = attempt_log(self._logs_dir(run_id).parent, attempt)
        fd = fsio.open_append(path)  # a symlink, FIFO or device there is refused, unblocked
        return fd, path

    def child_command(
        self,
        run_id: str,
        input_json: str | None = None,
        pause_seq: int | None = None,
        *,
        python: str | None = None,
    ) -> list[str]:
        """The command line of the child that resumes ``run_id`` (under ``python``, if given).

        An answer goes with the pause it answers, which the child checks under the
        run's lock: a request delivered twice is applied once.
        """
        cmd = [python or self.python, "-m", "afk_local", "resume", run_id]
        cmd += ["--root", str(self.store.root.absolute())]
        if input_json is not None:
            cmd += ["--input", input_json]
            if pause_seq is not None:
                cmd += ["--pause-seq", str(pause_seq)]
        return cmd

    def start(
        self,
        run_id: str,
        *,
        manual: bool = False,
        input_json: str | None = None,
        pause_seq: int | None = None,
    ) -> bool:
        """Claim ``run_id`` and start its child; False when it is not ours to resume."""
        if run_id in self.children or self._stopping:
            return False
        if not self._trusted(run_id):
            return False
        claimed = claim(self, run_id, manual=manual)
        if claimed is None:
            return False
        meta, seq = claimed.meta, claimed.seq_at_start
        attempt = meta.attempt + 1
        # A run made for the watcher (a schedule's slot, a submitted or restarted run)
        # records attempt 0: this child is its first start, not a resume.
        verb = "starting" if meta.attempt == 0 else "resuming"
        try:
            fd, log_path = self._open_log(run_id, attempt)
        except (OSError, AfkLocalError) as exc:
            self.emit("refused", run_id, f"cannot open its attempt log: {exc}")
            release(self, run_id, meta.watcher_attempts)
            return False
        try:
            header = (
                f"# afk-local watcher (pid {os.getpid()}, boot {boot_id()[:8]}) "
                f"{time.strftime('%Y-%m-%d %H:%M:%S')}: {verb} {run_id}, attempt {attempt}, "
                f"watcher attempt {meta.watcher_attempts}/{self.max_attempts}\n"
            )
            fsio.write_all(fd, header.encode(), log_path)
            # The run's own interpreter and working directory (where it was started),
            # else the watcher's: the child finds the job where it ran (runner.origin).
            plan = reentry_plan(meta)
            env = dict(os.environ)
            if self.store.head_dir_given:  # the child's Store must find the same head records
                env[HEAD_DIR_ENV] = str(self.store.head_dir)
            env[MAX_RECORD_BYTES_ENV] = str(self.store.max_record_bytes)
            env.update(self._key_env)
            env.update(child_clock_env())  # a test's clock reaches the run it wakes
            env.update(self.env)
            env.update(plan.env)
            env.setdefault("PYTHONUNBUFFERED", "1")
            proc = subprocess.Popen(
                self.child_command(run_id, input_json, pause_seq, python=plan.python),
                stdin=subprocess.DEVNULL,
                stdout=fd,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=plan.cwd,
                start_new_session=True,  # signals reach it only through the watcher
            )
        except OSError as exc:
            os.close(fd)
            self.emit("failed", run_id, f"cannot start the child: {exc}")
            attempt_died(
                self, run_id, meta.watcher_attempts, seq_at_start=seq, code=None, log_path=log_path
            )
            return False
        os.close(fd)
        self.children[run_id] = _Child(
            run_id, proc, meta.watcher_attempts, seq, log_path, time.monotonic()
        )
        self.emit(
            "started" if meta.attempt == 0 else "resumed",
            run_id,
            f"attempt {attempt} (pid {proc.pid})",
            attempt=meta.watcher_attempts,
            log=str(log_path),
        )
        return True

    def start_pending(self) -> None:
        """Start queued runs while there is room under ``concurrency``."""
        while self.pending and len(self.children) < self.concurrency and not self._stopping:
            self.start(self.pending.popleft())

    # -- children ending -----------------------------------------------------------

    def reap(self) -> None:
        """Collect children that exited and decide what their exit means."""
        for run_id, child in list(self.children.items()):
            code = child.proc.poll()
            if code is None:
                continue
            del self.children[run_id]
            self._finished(child, code)

    def _finished(self, child: _Child, code: int) -> None:
        run_id = child.run_id
        self.forget(run_id)
        try:
            meta = self.store.read_meta(run_id)
        except AfkLocalError as exc:
            self.emit("failed", run_id, f"cannot read run.meta after the attempt: {exc}")
            return
        logged = str(child.log_path)
        if code == LOCKED_EXIT:
            self.emit("taken", run_id, "another process holds the run", exit_code=code)
            return
        if meta.status is RunStatus.COMPLETED:
            self.emit("completed", run_id, "", exit_code=code, log=logged, attempt=child.attempt)
        elif meta.status is RunStatus.PAUSED:
            kind = meta.pause.kind if meta.pause else "input"
            self.emit("paused", run_id, f"waiting for {kind}", exit_code=code, log=logged)
        elif meta.status is RunStatus.FAILED:
            why = meta.error.message if meta.error else f"exit code {code}"
            self.emit("failed", run_id, why, exit_code=code, log=logged)
        elif meta.status is RunStatus.CANCELLED:
            self.emit("stopped", run_id, "cancelled", exit_code=code, log=logged)
        elif meta.status is RunStatus.SLEEPING:
            when = wake_time_text(meta.wake_at_ms)
            self.emit("sleeping", run_id, f"until {when}", exit_code=code, log=logged)
        elif self._stopping:
            self.emit("stopped", run_id, "stopped with the watcher", exit_code=code, log=logged)
            release(self, run_id, child.attempt)
        else:
            attempt_died(
                self,
                run_id,
                child.attempt,
                seq_at_start=child.seq_at_start,
                code=code,
                log_path=child.log_path,
            )

    # -- requests -------------------------------------------------------------------

    def handle_requests(self) -> None:
        """Run every request file in ``requests/`` (see :mod:`afk_local.watcher.requests`)."""
        process_requests(self)

    # -- the loop ---------------------------------------------------------------------

    def run_once(self) -> int:
        """Sweep, run the requests, resume every interrupted run, wait for them; 0 if all ok.

        1 when a run failed, gave up, backs off, is damaged or was refused (the trust
        gate: a copied or moved store, an untrusted directory), or a request was rejected.
        """
        self._prepare()
        self.handle_requests()
        self.sweep()
        while (self.pending or self.children) and not self.stop_event.is_set():
            self.start_pending()
            self.reap()
            if self.children:
                self.stop_event.wait(0.05)
        self.shutdown()
        # a refused run (a copied or moved store, an untrusted one) or a rejected request
        # needs a person as much as a failed one: a cron job must see it
        bad = sum(
            self.counts.get(kind, 0)
            for kind in ("failed", "gave_up", "backoff", "damaged", "refused", "rejected")
        )
        return 1 if bad else 0

    def serve(self, on_tick: Callable[[], None] | None = None) -> int:
        """Sweep, then watch ``runs/`` and ``requests/`` until :meth:`stop`; returns 0."""
        import watchfiles  # noqa: PLC0415 - only the serving watcher needs it

        self._prepare()
        self.handle_requests()
        self.sweep()
        self.start_pending()
        last_sweep = time.monotonic()
        poll_ms = max(int(min(self.interval, 0.5) * 1000), 20)
        requests_dir = str(self.store.requests_dir.resolve())
        for changes in watchfiles.watch(
            self.store.runs_dir,
            self.store.requests_dir,
            watch_filter=None,
            debounce=max(poll_ms, 50),
            step=20,
            stop_event=self.stop_event,
            rust_timeout=poll_ms,
            yield_on_timeout=True,
            raise_interrupt=False,
            recursive=False,
        ):
            if self.stop_event.is_set():
                break
            self.reap()
            timer = time.monotonic() - last_sweep >= self.interval
            if timer or any(path.startswith(requests_dir) for _, path in changes):
                self.handle_requests()  # on the timer too: a request may have waited for room
            if changes or timer:
                self.sweep()
                last_sweep = time.monotonic()
            self.start_pending()
            if on_tick is not None:
                on_tick()
        self.shutdown()
        return 0

    def _prepare(self) -> None:
        """Refuse a store nothing may be executed from; make its directories.

        Raises:
            UntrustedStoreError: the store's root or ``runs/`` is a symlink, not the
                user's, or writable by others; or the store is keyed and this watcher
                has no key (or another key).
        """
        for path, reason in store_problems(self.store):
            raise UntrustedStoreError(
                path, reason, "the watcher executes nothing from this store; fix it and restart"
            )
        fsio.make_dirs(self.store.runs_dir)
        fsio.make_dirs(self.store.requests_dir)
        if self.store.keyed:
            self.store.prepare_write()

    def stop(self) -> None:
        """Ask :meth:`serve` / :meth:`run_once` to end (safe from a signal handler)."""
        self.stop_event.set()

    def shutdown(self) -> None:
        """Tell children to stop (SIGTERM), wait ``grace`` seconds, then SIGKILL the rest."""
        if not self.children:
            return
        self._stopping = True
        self.emit("stopping", None, f"stopping {len(self.children)} run(s)")
        for child in self.children.values():
            with contextlib.suppress(OSError):
                child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        while self.children and time.monotonic() < deadline:
            self.reap()
            time.sleep(0.02)
        for child in self.children.values():
            with contextlib.suppress(OSError):
                child.proc.kill()
            child.proc.wait()
        self.reap()

    def install_signal_handlers(self) -> Callable[[], None]:
        """SIGTERM/SIGINT stop the watcher cleanly; returns a function restoring the old ones."""
        previous: dict[int, Any] = {}

        def handler(signum: int, frame: object) -> None:
            self.stop()

        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, handler)

        def restore() -> None:
            for sig, old in previous.items():
                signal.signal(sig, old)

        return restore

    def summary(self) -> str:
        """One line about what runs now: for the live status on a terminal."""
        now = time.monotonic()
        running = ", ".join(
            f"{c.run_id} ({now - c.started:.0f}s)" for c in list(self.children.values())[:4]
        )
        more = len(self.children) - 4
        text = f"{len(self.children)} running" + (f": {running}" if running else "")
        if more > 0:
            text += f" +{more}"
        if self.pending:
            text += f"; {len(self.pending)} queued"
        return text


__all__: Sequence[str] = [
    "LOCKED_EXIT",
    "WatchEvent",
    "Watcher",
]
