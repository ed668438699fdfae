"""The watcher's children: each resume is ``python -m afk_local resume RUN`` in a process of
its own, started after a claim (:mod:`afk_local.watcher.attempts`), its output in
``runs/<id>/logs/attempt-<n>.log``, its exit read back from the run's ``run.meta``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from afk_local.clock import child_clock_env
from afk_local.errors import AfkLocalError, UntrustedStoreError
from afk_local.runner.code.origin import reentry_plan
from afk_local.storage import fsio
from afk_local.storage.format.integrity import KEY_ENV
from afk_local.storage.format.records import RunStatus
from afk_local.storage.rundir.options import MAX_RECORD_BYTES_ENV
from afk_local.storage.rundir.ownership import boot_id
from afk_local.storage.rundir.read.heads import HEAD_DIR_ENV
from afk_local.storage.store import Store
from afk_local.storage.trust import path_problem
from afk_local.watcher.attempts import AttemptHost, attempt_died, attempt_log, claim, release
from afk_local.watcher.wakeups import wake_time_text

log = logging.getLogger("afk_local")

LOCKED_EXIT = 75
"""Exit code of ``afk-local resume`` when another process holds the run (EX_TEMPFAIL)."""


class ChildHost(AttemptHost, Protocol):
    """What starting and reaping children needs of the watcher."""

    python: str
    env: dict[str, str]
    grace: float

    def child_command(
        self,
        run_id: str,
        input_json: str | None = None,
        pause_seq: int | None = None,
        *,
        python: str | None = None,
    ) -> list[str]:
        """The command line of the child that resumes ``run_id``."""


@dataclass
class Child:
    """One running child: the run it resumes and what its exit is judged against."""

    run_id: str
    proc: subprocess.Popen[bytes]
    attempt: int
    seq_at_start: int
    log_path: Path
    started: float


def child_key_env(store: Store) -> dict[str, str]:
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


class Children:
    """The children of one watcher (``children``: by run id), started and reaped.

    Args:
        host: the watcher (its store, settings, events and attempt bookkeeping).
    """

    def __init__(self, host: ChildHost) -> None:
        self.host = host
        self.children: dict[str, Child] = {}
        self.stopping = False
        """Set by :meth:`shutdown`: nothing more is started."""
        self._key_env = child_key_env(host.store)

    def logs_dir(self, run_id: str) -> Path:
        """``runs/<id>/logs``, made if missing; a symlink or non-directory there is refused."""
        logs = attempt_log(self.host.store.paths(run_id).dir, 1).parent
        problem = path_problem(logs, directory=True)
        if problem is not None:
            raise UntrustedStoreError(
                str(logs), problem, "remove it; the watcher writes attempt logs there", run_id
            )
        # No fsync of the run directory: attempt logs are written unsynced (a power cut may
        # take their last lines, or them), and the next attempt makes the directory again.
        fsio.make_dir(logs, exist_ok=True, sync_parent=False)
        return logs

    def _open_log(self, run_id: str, attempt: int) -> tuple[int, Path]:
        path = attempt_log(self.logs_dir(run_id).parent, attempt)
        fd = fsio.open_append(path)  # a symlink, FIFO or device there is refused, unblocked
        return fd, path

    def command(
        self,
        run_id: str,
        input_json: str | None = None,
        pause_seq: int | None = None,
        *,
        python: str | None = None,
    ) -> list[str]:
        """The command line of the child that resumes ``run_id`` (see
        :meth:`afk_local.watcher.watcher.Watcher.child_command`)."""
        cmd = [python or self.host.python, "-m", "afk_local", "resume", run_id]
        cmd += ["--root", str(self.host.store.root.absolute())]
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
        """Claim ``run_id`` (trusted already) and start its child; False when it is not
        ours to resume."""
        host = self.host
        claimed = claim(host, run_id, manual=manual)
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
            host.emit("refused", run_id, f"cannot open its attempt log: {exc}")
            release(host, run_id, meta.watcher_attempts)
            return False
        try:
            header = (
                f"# afk-local watcher (pid {os.getpid()}, boot {boot_id()[:8]}) "
                f"{time.strftime('%Y-%m-%d %H:%M:%S')}: {verb} {run_id}, attempt {attempt}, "
                f"watcher attempt {meta.watcher_attempts}/{host.max_attempts}\n"
            )
            fsio.write_all(fd, header.encode(), log_path)
            # The run's own interpreter and working directory (where it was started),
            # else the watcher's: the child finds the job where it ran (runner.origin).
            plan = reentry_plan(meta)
            proc = subprocess.Popen(
                host.child_command(run_id, input_json, pause_seq, python=plan.python),
                stdin=subprocess.DEVNULL,
                stdout=fd,
                stderr=subprocess.STDOUT,
                env=self._environment(plan.env),
                cwd=plan.cwd,
                start_new_session=True,  # signals reach it only through the watcher
            )
        except OSError as exc:
            os.close(fd)
            host.emit("failed", run_id, f"cannot start the child: {exc}")
            attempt_died(
                host, run_id, meta.watcher_attempts, seq_at_start=seq, code=None, log_path=log_path
            )
            return False
        os.close(fd)
        self.children[run_id] = Child(
            run_id, proc, meta.watcher_attempts, seq, log_path, time.monotonic()
        )
        host.emit(
            "started" if meta.attempt == 0 else "resumed",
            run_id,
            f"attempt {attempt} (pid {proc.pid})",
            attempt=meta.watcher_attempts,
            log=str(log_path),
        )
        return True

    def _environment(self, run_env: dict[str, str]) -> dict[str, str]:
        store = self.host.store
        env = dict(os.environ)
        if store.head_dir_given:  # the child's Store must find the same head records
            env[HEAD_DIR_ENV] = str(store.head_dir)
        env[MAX_RECORD_BYTES_ENV] = str(store.max_record_bytes)
        env.update(self._key_env)
        env.update(child_clock_env())  # a test's clock reaches the run it wakes
        env.update(self.host.env)
        env.update(run_env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def reap(self) -> None:
        """Collect children that exited and decide what their exit means."""
        for run_id, child in list(self.children.items()):
            code = child.proc.poll()
            if code is None:
                continue
            del self.children[run_id]
            self._finished(child, code)

    def _finished(self, child: Child, code: int) -> None:
        host, run_id = self.host, child.run_id
        host.forget(run_id)
        try:
            meta = host.store.read_meta(run_id)
        except AfkLocalError as exc:
            host.emit("failed", run_id, f"cannot read run.meta after the attempt: {exc}")
            return
        logged = str(child.log_path)
        said: dict[str, Any] = {"exit_code": code, "log": logged}
        if code == LOCKED_EXIT:
            host.emit("taken", run_id, "another process holds the run", exit_code=code)
        elif meta.status is RunStatus.COMPLETED:
            host.emit("completed", run_id, "", attempt=child.attempt, **said)
        elif meta.status is RunStatus.PAUSED:
            kind = meta.pause.kind if meta.pause else "input"
            host.emit("paused", run_id, f"waiting for {kind}", **said)
        elif meta.status is RunStatus.FAILED:
            why = meta.error.message if meta.error else f"exit code {code}"
            host.emit("failed", run_id, why, **said)
        elif meta.status is RunStatus.CANCELLED:
            host.emit("stopped", run_id, "cancelled", **said)
        elif meta.status is RunStatus.SLEEPING:
            host.emit("sleeping", run_id, f"until {wake_time_text(meta.wake_at_ms)}", **said)
        elif self.stopping:
            host.emit("stopped", run_id, "stopped with the watcher", **said)
            release(host, run_id, child.attempt)
        else:
            attempt_died(
                host,
                run_id,
                child.attempt,
                seq_at_start=child.seq_at_start,
                code=code,
                log_path=child.log_path,
            )

    def shutdown(self) -> None:
        """Tell children to stop (SIGTERM), wait ``grace`` seconds, then SIGKILL the rest."""
        if not self.children:
            return
        self.stopping = True
        self.host.emit("stopping", None, f"stopping {len(self.children)} run(s)")
        for child in self.children.values():
            with contextlib.suppress(OSError):
                child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.host.grace
        while self.children and time.monotonic() < deadline:
            self.reap()
            time.sleep(0.02)
        for child in self.children.values():
            with contextlib.suppress(OSError):
                child.proc.kill()
            child.proc.wait()
        self.reap()

    def summary(self) -> str:
        """One line about what runs now (without the queue)."""
        now = time.monotonic()
        running = ", ".join(
            f"{c.run_id} ({now - c.started:.0f}s)" for c in list(self.children.values())[:4]
        )
        more = len(self.children) - 4
        text = f"{len(self.children)} running" + (f": {running}" if running else "")
        if more > 0:
            text += f" +{more}"
        return text


__all__ = ["LOCKED_EXIT", "Child", "ChildHost", "Children", "child_key_env"]
