"""The watcher: finds interrupted runs and resumes them, also after a reboot (docs/watcher.md).

A run is *interrupted* when its status is ``running`` (or ``created``) and nobody
holds its ``owner.lock`` (the one definition:
:func:`~afk_local.storage.rundir.ownership.is_interrupted`); the lock is the truth,
whatever ``run.meta`` says about the owner (a run from an earlier boot with a free
lock is interrupted, a run whose lock is held is never touched). :class:`Watcher`
sweeps the store, then watches the store's root, ``runs/`` and ``requests/`` with
watchfiles: the writers of runs append to ``runs.changes`` in the root, so an event
says which runs to look at, and a steady sweep on a timer probes the locks of the runs
that expect an owner (a dying process makes no filesystem event) and checks a slice of
the others (a change nothing told). Every resume is a child process, ``python -m
afk_local resume RUN``, that takes the lock itself; its output goes to
``runs/<id>/logs/attempt-<n>.log``.

The work is in rooms of its own: finding runs (:mod:`.sweeping`), children
(:mod:`.children`), attempts (:mod:`.attempts`), requests (:mod:`.requests`) and
schedules (:mod:`.schedules`); :class:`Watcher` holds the settings and the loop.

Crash loops: every automatic resume is an *attempt*, claimed under the run's lock
with a lease, backed off after each death without progress and given up past
``max_attempts`` (see :mod:`afk_local.watcher.attempts`).

Example:
    >>> from afk_local.watcher.watcher import Watcher  # doctest: +SKIP
    >>> Watcher(afk.Store("~/.afk")).run_once()  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import math
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from afk_local.errors import UntrustedStoreError
from afk_local.storage import fsio
from afk_local.storage.format.records import RunMeta
from afk_local.storage.rundir.run_changes import CHANGES_NAME
from afk_local.storage.store import Store
from afk_local.storage.trust import store_problems
from afk_local.watcher.attempts import update_meta_unowned
from afk_local.watcher.children import LOCKED_EXIT, Child, Children
from afk_local.watcher.events import WatchEvent
from afk_local.watcher.requests import process_requests
from afk_local.watcher.schedules import Scheduler
from afk_local.watcher.sweeping import Sweeper

log = logging.getLogger("afk_local")


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
        safety_period: seconds within which a serving watcher has checked every run's
            ``run.meta`` once more, a slice per sweep: for a change that made no event
            (a writer killed before it told ``runs.changes``, a filesystem without
            inotify).
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
        safety_period: float = 60.0,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        if interval <= 0:
            raise ValueError("interval must be > 0 seconds")
        if safety_period <= 0:
            raise ValueError("safety_period must be > 0 seconds")
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
        self.safety_period = safety_period
        self.launcher = Children(self)
        self.children: dict[str, Child] = self.launcher.children
        self.pending: deque[str] = deque()
        self.stop_event = threading.Event()
        self.counts: dict[str, int] = {}
        self.sweeper = Sweeper(self, slices=max(1, math.ceil(safety_period / interval)))
        self.scheduler = Scheduler(self)

    def __repr__(self) -> str:
        return f"Watcher(root={str(self.store.root)!r}, children={len(self.children)})"

    def emit(self, kind: str, run_id: str | None = None, message: str = "", **fields: Any) -> None:
        """Record an event: count it, log it, hand it to ``on_event``."""
        event = WatchEvent(kind, run_id, message, **fields)
        self.counts[kind] = self.counts.get(kind, 0) + 1
        log.info("watcher: %s %s %s", kind, run_id or "", message)
        if self.on_event is not None:
            self.on_event(event)

    # -- finding interrupted runs (afk_local.watcher.sweeping) ---------------------------

    def forget(self, run_id: str) -> None:
        """Drop the cached ``run.meta`` of ``run_id``: it changed (or is about to)."""
        self.sweeper.forget(run_id)

    def interrupted(self, now: int | None = None, *, full: bool = True) -> list[str]:
        """Runs a watcher should resume now: interrupted, resumable, not backing off.

        A run without an entrypoint (not an ``@afk.durable`` job nor an agent run
        with a rebuildable agent: a StateCheckpoint, a LangGraph thread, a
        subagent's child run) has nothing to re-import and is left alone; so is
        every run whose lock is held, and every run whose ``owner.lock`` is damaged
        (reported once as a ``damaged`` event; the sweep goes on with the others).
        ``full``: every run's meta is checked; else only what may have changed
        (:mod:`afk_local.watcher.sweeping`).
        """
        return self.sweeper.interrupted(now, full=full)

    def sweep(self, *, full: bool = True) -> list[str]:
        """Start due schedule slots, then queue every interrupted run (once); returns them.

        ``full``: every run's meta checked; else a steady sweep (what changed, and a
        slice of the rest), as :meth:`serve` makes after its first.
        """
        self.scheduler.start_due_runs()  # as `created` runs, which the sweep below finds
        found = self.interrupted(full=full)
        queued = set(self.pending)
        for run_id in found:
            if run_id not in queued:
                self.pending.append(run_id)
        return found

    # -- children (afk_local.watcher.children) ------------------------------------------

    def update_meta_unowned(
        self, run_id: str, change: Callable[[RunMeta], dict[str, Any] | None]
    ) -> RunMeta | None:
        """Change ``run.meta`` of a run nobody owns, holding its lock for a moment.

        See :func:`afk_local.watcher.attempts.update_meta_unowned`.
        """
        return update_meta_unowned(self.store, run_id, change)

    def logs_dir(self, run_id: str) -> Path:
        """``runs/<id>/logs``, made if missing; a symlink or non-directory there is refused."""
        return self.launcher.logs_dir(run_id)

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
        return self.launcher.command(run_id, input_json, pause_seq, python=python)

    def start(
        self,
        run_id: str,
        *,
        manual: bool = False,
        input_json: str | None = None,
        pause_seq: int | None = None,
    ) -> bool:
        """Claim ``run_id`` and start its child; False when it is not ours to resume."""
        if run_id in self.children or self.launcher.stopping:
            return False
        if not self.sweeper.trusted(run_id):
            return False
        return self.launcher.start(
            run_id, manual=manual, input_json=input_json, pause_seq=pause_seq
        )

    def start_pending(self) -> None:
        """Start queued runs while there is room under ``concurrency``."""
        while self.pending and len(self.children) < self.concurrency and not self.launcher.stopping:
            self.start(self.pending.popleft())

    def reap(self) -> None:
        """Collect children that exited and decide what their exit means."""
        self.launcher.reap()

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
        """Sweep, then watch the store until :meth:`stop`; returns 0.

        Events in ``requests/`` run the requests; events in ``runs/`` or on
        ``runs.changes`` make a steady sweep, which reads only what the writers told
        since. Every ``interval`` a steady sweep runs all the same: it probes the
        locks of the runs that expect an owner and checks the next slice of the rest.
        """
        import watchfiles  # noqa: PLC0415 - only the serving watcher needs it

        self._prepare()
        self.handle_requests()
        self.sweep()
        self.start_pending()
        last_sweep = time.monotonic()
        poll_ms = max(int(min(self.interval, 0.5) * 1000), 20)
        requests_dir = str(self.store.requests_dir.resolve())
        root = self.store.root.resolve()
        runs_dir, changes = str(self.store.runs_dir.resolve()), str(root / CHANGES_NAME)
        for events in watchfiles.watch(
            root,
            runs_dir,
            requests_dir,
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
            paths = {path for _, path in events}
            if timer or any(path.startswith(requests_dir) for path in paths):
                self.handle_requests()  # on the timer too: a request may have waited for room
            if timer or any(p == changes or p.startswith(runs_dir) for p in paths):
                self.sweep(full=False)
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
        self.launcher.shutdown()

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
        text = self.launcher.summary()
        if self.pending:
            text += f"; {len(self.pending)} queued"
        return text


__all__: Sequence[str] = [
    "LOCKED_EXIT",
    "WatchEvent",
    "Watcher",
]
