"""Who owns a run: the ``owner.lock`` that is the truth, and the identity recorded for people.

A run's owner holds an exclusive ``flock`` on ``owner.lock`` for the run's whole
life; the kernel drops it when the process dies, however it dies. The
:class:`~afk_local.storage.records.OwnerInfo` (pid, hostname, boot id, process start
time) is recorded in ``run.meta`` for display and for filesystems without
working locks.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import socket
import sys
import time

from filelock import FileLock, Timeout

from afk_local.errors import RunLockedError
from afk_local.storage import fsio
from afk_local.storage.codec import RecordCodec
from afk_local.storage.layout import RunPaths
from afk_local.storage.reader import read_meta
from afk_local.storage.records import OwnerInfo

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


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
        boot = str(int(time.time() - time.monotonic()) // 60)  # minutes: tolerate clock jitter
    return hashlib.blake2b(f"{socket.gethostname()}|{boot}".encode(), digest_size=16).hexdigest()


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


def current_owner() -> OwnerInfo:
    """The identity of this process, as recorded in ``RunMeta.owner``."""
    pid = os.getpid()
    return OwnerInfo(
        pid=pid, hostname=socket.gethostname(), boot_id=boot_id(), process_start=process_start(pid)
    )


def lock_is_held(lock_path: str | os.PathLike[str]) -> bool:
    """True when some process (this one included) holds ``owner.lock`` exclusively.

    Probes with a shared, non-blocking flock on a descriptor of its own, so it
    never creates the file and never blocks; a missing lock file means nobody holds it.
    """
    try:
        fd = os.open(lock_path, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError:
        return True  # cannot tell (permissions, a symlink planted there): do not touch the run
    try:
        try:
            import fcntl  # noqa: PLC0415 - not on Windows
        except ImportError:  # pragma: no cover - Windows
            return _held_windows(str(lock_path))
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return True
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
    """Take ``owner.lock`` or raise :class:`RunLockedError` (after ``timeout`` seconds)."""
    lock = FileLock(
        str(paths.lock),
        timeout=timeout,
        mode=fsio.FILE_MODE,
        thread_local=False,
        fallback_to_soft=False,
        preserve_lock_file=True,
    )
    try:
        lock.acquire()
    except Timeout:
        owner = None
        try:
            meta_owner = read_meta(paths, RecordCodec()).owner
            if meta_owner is not None:
                owner = f"pid {meta_owner.pid} on {meta_owner.hostname}"
        except Exception:
            owner = None
        raise RunLockedError(paths.run_id, str(paths.lock), owner) from None
    return lock
