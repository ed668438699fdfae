"""Who owns a run: the ``owner.lock`` that is the truth, and the identity recorded for people.

A run's owner holds an exclusive ``flock`` on ``owner.lock`` for the run's whole
life; the kernel drops it when the process dies, however it dies. The
:class:`~afk_local.storage.format.records.OwnerInfo` (pid, hostname, boot id, process start
time) is recorded in ``run.meta`` for display and for filesystems without
working locks.

Asking "is the owner alive?" (:func:`probe_owner`) must never fail or block an
owner. flock offers no query, so the probe takes a *shared* lock for the two
system calls it needs; an owner whose exclusive attempt meets only such shared
holders (no exclusive holder: a shared lock of its own would succeed) tries again
instead of giving up (:func:`acquire_lock`), so a probe costs an owner at most a
few microseconds, never a spurious :class:`~afk_local.errors.RunLockedError`.

An ``owner.lock`` that is not a regular file afk_local can open (a symlink, a
FIFO, a directory, an unreadable file: planted, or damaged) is neither a live
owner nor a free lock: the probe reports it as damage (without following or
blocking on it) and nothing takes it as a lock.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import random
import stat
import sys
import time
from typing import TYPE_CHECKING

import msgspec

from afk_local.errors import CheckpointCorruptionError, RunLockedError
from afk_local.storage import fsio
from afk_local.storage.format.codec import RecordCodec
from afk_local.storage.format.layout import RunPaths
from afk_local.storage.format.records import OwnerInfo, RunStatus, now_ms
from afk_local.storage.rundir.read.reader import read_meta

# filelock is loaded where a lock is taken: probing whether an owner is alive (listings,
# show, gc's checks) and reading a run never need it.
if TYPE_CHECKING:
    from filelock import FileLock

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)

PROBE_GRACE_S = 1.0
"""How long past its ``lock_timeout`` an owner keeps trying while only probes hold the lock."""


@functools.lru_cache(maxsize=1)
def boot_id() -> str:
    """An id that changes at every boot of this machine.

    Linux: ``/proc/sys/kernel/random/boot_id``. Elsewhere: the boot time (from
    ``sysctl kern.boottime`` on macOS/BSD), hashed with the hostname.
    """
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            return fh.read(64).strip()
    except OSError:
        pass
    boot = ""
    if sys.platform != "win32":
        import subprocess  # noqa: PLC0415 - only where /proc is missing

        with contextlib.suppress(OSError, subprocess.SubprocessError):
            boot = subprocess.run(
                ["/usr/sbin/sysctl", "-n", "kern.boottime"],
                capture_output=True,
                text=True,
                timeout=5,
                check=False,
            ).stdout.strip()
    if not boot:
        boot = str(int(now_ms() / 1000 - time.monotonic()) // 60)  # minutes: tolerate clock jitter
    return hashlib.blake2b(f"{_hostname()}|{boot}".encode(), digest_size=16).hexdigest()


def _hostname() -> str:
    """This machine's name (``socket.gethostname()``; the socket module, about 10 ms to
    import here, is loaded only by a process that owns or probes a run)."""
    import socket  # noqa: PLC0415

    return socket.gethostname()


def process_start(pid: int) -> int:
    """Start time of process ``pid`` in clock ticks since boot (0 where unknown)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            stat = fh.read(4096)
    except OSError:
        return 0
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = stat.rpartition(")")[2].split()
    try:
        return int(fields[19])  # field 22 overall
    except (IndexError, ValueError):
        return 0


_owner: OwnerInfo | None = None  # this process's, found once (a forked child finds its own)


def current_owner() -> OwnerInfo:
    """The identity of this process, as recorded in ``RunMeta.owner``.

    Found once per process: reading ``/proc/<pid>/stat`` cost a fan-out worker about a
    millisecond per run on a loaded machine, and none of it changes while the process lives.
    """
    global _owner  # noqa: PLW0603 - one per process, like boot_id's cache
    pid = os.getpid()
    owner = _owner
    if owner is None or owner.pid != pid:
        owner = _owner = OwnerInfo(
            pid=pid,
            hostname=_hostname(),
            boot_id=boot_id(),
            process_start=process_start(pid),
        )
    return owner


class OwnerProbe(msgspec.Struct, frozen=True):
    """What :func:`probe_owner` found: a live owner, a free lock, or a damaged lock file."""

    held: bool
    """True when some process (this one included) holds ``owner.lock`` exclusively."""
    problem: str | None = None
    """Set when ``owner.lock`` is not a lock afk_local can use (a symlink, a FIFO...)."""


def is_interrupted(status: RunStatus, owner: OwnerProbe) -> bool:
    """The one definition of an *interrupted* run: a crash left it behind.

    Its status expects an owner (``running`` or ``created``) and nobody holds its
    ``owner.lock``. The lock is the truth, whatever ``run.meta`` says about the owner:
    a run from an earlier boot with a free lock is interrupted. A damaged lock file
    (:attr:`OwnerProbe.problem`) is not: nobody can take the run over until a person
    repairs it.
    """
    return status.expects_owner and not owner.held and owner.problem is None


def probe_owner(lock_path: str | os.PathLike[str]) -> OwnerProbe:
    """Whether a process holds ``owner.lock``, without blocking, following or failing anyone.

    A missing lock file means nobody holds it. A lock file that is not a regular
    file afk_local can open is reported as a problem, never as a live owner.
    """
    path = os.fspath(lock_path)
    problem = fsio.regular_file_problem(path)
    if problem is not None:
        return OwnerProbe(held=False, problem=f"owner.lock {problem}")
    try:
        fd = os.open(path, os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC)
    except FileNotFoundError:
        return OwnerProbe(held=False)
    except OSError as exc:
        return OwnerProbe(held=False, problem=f"owner.lock cannot be opened: {exc.strerror}")
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return OwnerProbe(held=False, problem="owner.lock is not a regular file")
        try:
            import fcntl  # noqa: PLC0415 - not on Windows
        except ImportError:  # pragma: no cover - Windows
            return OwnerProbe(held=_held_windows(path))
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return OwnerProbe(held=True)
        except OSError as exc:  # no flock on this filesystem: nobody can own the run here
            return OwnerProbe(held=False, problem=f"owner.lock cannot be locked: {exc.strerror}")
        fcntl.flock(fd, fcntl.LOCK_UN)
        return OwnerProbe(held=False)
    finally:
        os.close(fd)


def lock_is_held(lock_path: str | os.PathLike[str]) -> bool:
    """True when some process (this one included) holds ``owner.lock`` exclusively.

    A damaged lock file counts as not held; :func:`probe_owner` says what is wrong with it.
    """
    return probe_owner(lock_path).held


def _exclusive_holder(lock_path: str) -> bool:
    """True unless a shared lock on ``lock_path`` can be had now (then only probes hold it)."""
    try:
        import fcntl  # noqa: PLC0415 - not on Windows
    except ImportError:  # pragma: no cover - Windows: no shared probes there
        return True
    try:
        fd = os.open(lock_path, os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def _held_windows(lock_path: str) -> bool:  # pragma: no cover - Windows
    from filelock import FileLock, Timeout  # noqa: PLC0415

    probe = FileLock(lock_path, timeout=0, thread_local=False)
    try:
        probe.acquire()
    except Timeout:
        return True
    probe.release()
    return False


def acquire_lock(paths: RunPaths, timeout: float) -> FileLock:
    """Take ``owner.lock`` or raise :class:`RunLockedError` (after ``timeout`` seconds).

    A contention that only probes caused (shared holders, no exclusive one) is
    retried, for up to :data:`PROBE_GRACE_S` past ``timeout``: probing never fails
    an owner.

    Raises:
        RunLockedError: another process owns the run.
        CheckpointCorruptionError: ``owner.lock`` is not a regular file (a symlink,
            a FIFO...): never followed, never used as a lock.
    """
    from filelock import FileLock, Timeout  # noqa: PLC0415

    problem = fsio.regular_file_problem(paths.lock)
    if problem is not None:
        raise CheckpointCorruptionError(
            str(paths.lock),
            f"{problem}; it is no lock afk_local made: remove it once no process uses the run",
            paths.run_id,
        )
    lock = FileLock(
        str(paths.lock),
        timeout=timeout,
        mode=fsio.FILE_MODE,
        thread_local=False,
        fallback_to_soft=False,
        preserve_lock_file=True,
    )
    deadline = time.monotonic() + timeout
    while True:
        try:
            # A negative timeout waits for ever, as in filelock.
            lock.acquire(timeout=timeout if timeout < 0 else max(deadline - time.monotonic(), 0.0))
            return lock
        except Timeout:
            if time.monotonic() < deadline + PROBE_GRACE_S and not _exclusive_holder(
                str(paths.lock)
            ):
                time.sleep(random.uniform(0.0002, 0.002))  # a probe's shared lock: gone at once
                continue
        owner = None
        try:
            meta_owner = read_meta(paths, RecordCodec()).owner
            if meta_owner is not None:
                owner = f"pid {meta_owner.pid} on {meta_owner.hostname}"
        except Exception:
            owner = None
        raise RunLockedError(paths.run_id, str(paths.lock), owner) from None
