"""Durable file primitives. Every write-side system call of afk_local goes through here.

Keeping all durable I/O in one module gives one place to get fsync right
(``F_FULLFSYNC`` on macOS) and one place where tests can inject faults. The
write-side calls are methods of an :class:`Env`, which a store holds (LevelDB's
``Env``, one per database); the module-level functions act on :data:`DEFAULT_ENV`,
the process-wide one. An Env's I/O hook (:func:`set_io_hook` for the default one)
is called before each operation with its name and path, so a test process can
SIGKILL itself at the N-th call or make an fsync fail. Its I/O recorder
(:func:`set_io_recorder`) sees every call with what it did (the bytes written, the
old name of a rename), so the crash-state explorer (``afk_local.testing.crashsim``)
can replay a run onto a model of the disk.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import itertools
import os
import stat
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

from afk_local.errors import DiskFullError, NotRegularFileError

_NO_SPACE = frozenset(code for code in (errno.ENOSPC, getattr(errno, "EDQUOT", None)) if code)


def _mount_of(path: str) -> str:
    """The mount point of the filesystem holding ``path`` (its nearest existing ancestor)."""
    here = os.path.abspath(path or ".")
    while not os.path.lexists(here) and os.path.dirname(here) != here:
        here = os.path.dirname(here)
    while not os.path.ismount(here):
        here = os.path.dirname(here)
    return here


class _disk_full_named:
    """Turn a write's ENOSPC or EDQUOT into :class:`DiskFullError`: one line, the disk named.

    A class, not a generator context manager: it wraps every write and fsync, and a
    journaled step makes four of those (a generator costs several microseconds each).
    """

    __slots__ = ("path",)

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = path

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if not isinstance(exc, OSError) or exc.errno not in _NO_SPACE:
            return
        if isinstance(exc, DiskFullError):
            return
        where = os.fspath(self.path)
        directory = where if os.path.isdir(where) else os.path.dirname(where) or "."
        mount = _mount_of(directory)
        try:
            vfs = os.statvfs(mount)
            free = vfs.f_bavail * vfs.f_frsize  # what shutil.disk_usage calls free
        except OSError:
            free = 0
        raise DiskFullError(directory, mount, free, exc.errno or errno.ENOSPC) from None


IoHook = Callable[[str, str], None]
"""``hook(operation, path)``; operation is one of open, write, fsync, rename,
symlink, link, unlink, truncate, mkdir (an exchange of two names is a rename here)."""


class IoCall(NamedTuple):
    """One durable I/O call as an I/O recorder sees it (see :func:`set_io_recorder`)."""

    operation: str
    """open, write, fsync, rename, exchange, symlink, link, unlink, truncate or mkdir."""
    path: str
    """The file or directory acted on; for rename, link and symlink the new name."""
    source: str = ""
    """rename and link: the old path; exchange: the other name; symlink: the link's
    target text."""
    data: bytes = b""
    """write: the bytes written."""
    offset: int = 0
    """write: the file offset the bytes went to; truncate: the new length."""
    append: bool = False
    """open: the file was opened for appending (a log), not created for one write."""


IoRecorder = Callable[[IoCall], None]
"""``recorder(call)``: called after each durable I/O call succeeded (an fsync: as it starts)."""

TEMP_PREFIX = ".tmp-"
"""Names starting with this are unpublished temporaries, removed when a run is reopened."""

FILE_MODE = 0o600
DIR_MODE = 0o700

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


def file_kind(mode: int) -> str:
    """What an ``st_mode`` is, in words (``regular file``, ``FIFO``, ``symlink``...)."""
    for test, name in (
        (stat.S_ISREG, "regular file"),
        (stat.S_ISDIR, "directory"),
        (stat.S_ISLNK, "symlink"),
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
    ):
        if test(mode):
            return name
    return "special file"


def open_regular(path: str | os.PathLike[str], flags: int = os.O_RDONLY, mode: int = 0o600) -> int:
    """Open a regular file without following a symlink and without blocking; returns the fd.

    ``O_NOFOLLOW`` refuses a symlink (``ELOOP``); ``O_NONBLOCK`` keeps a FIFO from
    blocking the open, and ``fstat`` then refuses anything but a regular file
    (:class:`NotRegularFileError`). The descriptor is switched back to blocking mode.
    """
    fd, _ = _open_checked(path, flags, mode)
    if _O_NONBLOCK:
        try:
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
    return fd


def _open_checked(
    path: str | os.PathLike[str], flags: int, mode: int
) -> tuple[int, os.stat_result]:
    """:func:`open_regular`'s open and checks, the descriptor left non-blocking (which a
    regular file's reads ignore), with its ``fstat``."""
    try:
        fd = os.open(path, flags | _O_NOFOLLOW | _O_CLOEXEC | _O_NONBLOCK, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(
                errno.ELOOP, "is a symlink, refused (never followed)", os.fspath(path)
            ) from None
        if exc.errno == errno.ENXIO:  # a socket, or a FIFO opened for writing with no reader
            raise NotRegularFileError(path, "socket or FIFO") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFileError(path, file_kind(st.st_mode))
    except BaseException:
        os.close(fd)
        raise
    return fd, st


_O_CREATE_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC
_DARWIN = sys.platform == "darwin"
_NO_SYMLINKS = frozenset((errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS))
"""What symlink(2) says where symlinks cannot be made (a pointer file stands in)."""
_AT_CALLS = {os.open, os.rename, os.symlink, os.unlink} <= os.supports_dir_fd
"""The platform names files relative to a directory descriptor (``openat`` and kin):
POSIX systems do; Windows does not (it has no directory descriptors either)."""


# Temp names: the pid, a random token drawn once per process and a counter. Unique
# among processes (pid, token) and within one (counter), and far cheaper per write
# than drawing random bytes (a getrandom call) every time.
_AT_FDCWD = -100
_SWAP = 2  # RENAME_EXCHANGE (Linux), RENAME_SWAP (macOS)
_CANNOT_SWAP = frozenset(
    code
    for code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, getattr(errno, "EOPNOTSUPP", None))
    if code
)


def _swap_call() -> Callable[[bytes, bytes], int] | None:
    """The C library's atomic exchange of two names, or None where it has none."""
    if sys.platform not in ("linux", "darwin"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    if sys.platform == "linux":
        renameat2 = getattr(libc, "renameat2", None)  # glibc >= 2.28, musl >= 1.2.3
        if renameat2 is None:
            return None
        renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p]
        renameat2.argtypes += [ctypes.c_uint]
        renameat2.restype = ctypes.c_int
        return lambda a, b: int(renameat2(_AT_FDCWD, a, _AT_FDCWD, b, _SWAP))
    renamex_np = getattr(libc, "renamex_np", None)
    if renamex_np is None:
        return None
    renamex_np.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint]
    renamex_np.restype = ctypes.c_int
    return lambda a, b: int(renamex_np(a, b, _SWAP))


_SWAP_CALL = _swap_call()


def _exchange(a: bytes, b: bytes) -> bool:
    """Swap names ``a`` and ``b`` atomically; False where that cannot be done (nothing changed)."""
    if _SWAP_CALL is None:
        return False
    if _SWAP_CALL(a, b) == 0:
        return True
    code = ctypes.get_errno()
    if code in _CANNOT_SWAP:
        return False
    raise OSError(code, os.strerror(code), os.fsdecode(b))


class _TempNames:
    token = os.urandom(4).hex()
    counter = itertools.count()
    pid = os.getpid()

    @classmethod
    def renew(cls) -> None:
        cls.token = os.urandom(4).hex()
        cls.pid = os.getpid()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_TempNames.renew)


def _temp_name(name: str) -> str:
    return f"{TEMP_PREFIX}{name}.{_TempNames.pid}.{_TempNames.token}{next(_TempNames.counter):x}"


def temp_path(directory: str | os.PathLike[str], name: str) -> Path:
    """A fresh temporary name for ``name`` inside ``directory``."""
    return Path(directory) / _temp_name(name)


def _temp_sibling(path: str) -> str:
    if os.altsep:  # Windows: either separator may be in the path
        directory, name = os.path.split(path)
        return os.path.join(directory, _temp_name(name))
    directory, sep, name = path.rpartition(os.sep)
    return f"{directory}{sep}{_temp_name(name)}"


def open_dir(path: str | os.PathLike[str]) -> int | None:
    """A descriptor of directory ``path`` to fsync it through, or None where directories
    cannot be opened (Windows; :func:`fsync_dir` does nothing there)."""
    if sys.platform == "win32":
        return None
    return os.open(path, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)


def read_link(link: str | os.PathLike[str], *, max_bytes: int = 4096) -> str | None:
    """The target name of a symlink or pointer file, or None when there is none."""
    try:
        return os.readlink(link)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno != errno.EINVAL:  # EINVAL: not a symlink, maybe a pointer file
            return None
    try:
        data = read_bounded(link, max_bytes)
    except (OSError, ValueError):
        return None
    try:
        return data.decode().strip() or None
    except UnicodeDecodeError:
        return None


def read_bounded(path: str | os.PathLike[str], max_bytes: int) -> bytes:
    """Read a regular file (not following symlinks) of at most ``max_bytes``.

    Raises ValueError when the file is larger than the bound, before reading it;
    OSError for a symlink and :class:`NotRegularFileError` for a FIFO, socket or
    device (without blocking on it).
    """
    fd, st = _open_checked(path, os.O_RDONLY, 0o600)  # four system calls in all
    try:
        size = st.st_size
        if size > max_bytes:
            raise ValueError(f"{size} bytes, over the bound of {max_bytes}")
        chunks: list[bytes] = []
        remaining = size
        while remaining > 0:
            try:
                chunk = os.read(fd, remaining)
            except BlockingIOError:  # a file system that honours O_NONBLOCK on a file
                os.set_blocking(fd, True)
                continue
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def regular_file_problem(path: str | os.PathLike[str]) -> str | None:
    """What is wrong with ``path`` where afk_local expects a regular file of its own, or None.

    None also when nothing is there. Never blocks and never follows a symlink: a
    symlink, a FIFO, a socket, a device or a directory is named as such, and a
    file that cannot be opened for reading says why (permission denied).
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot be examined: {exc.strerror or exc}"
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        return f"is a symlink (to {target!r}), which afk_local never makes"
    if not stat.S_ISREG(st.st_mode):
        return f"is a {file_kind(st.st_mode)}, not a regular file"
    try:
        fd = os.open(path, os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot be opened: {exc.strerror or exc}"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped since the lstat
            return "is not a regular file"
    finally:
        os.close(fd)
    return None


def replace_unsynced(path: str | os.PathLike[str], data: bytes, env: Env | None = None) -> None:
    """Replace ``path`` by ``data`` all at once (temp file + rename), with no fsync.

    Only for small records that may lag behind a crash but never lead (a keyed store's
    head records, the listing cache): not a durable write, so the I/O hook does not see
    it. The recorder of :data:`DEFAULT_ENV` does (an open, a write and a rename with no
    fsync), so the crash-state explorer models what a crash leaves of such a record;
    ``env``: the recorder of that store's :class:`Env` instead (a store with its own).
    """
    recorder = env if env is not None else DEFAULT_ENV
    target = os.fspath(path)
    tmp = _temp_sibling(target)
    try:
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC, FILE_MODE
        )
        try:
            recorder._record(IoCall("open", tmp))
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            recorder._record(IoCall("write", tmp, data=bytes(data)))
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    recorder._record(IoCall("rename", target, source=tmp))


def append_unsynced(path: str | os.PathLike[str], data: bytes, env: Env | None = None) -> None:
    """Append ``data`` to ``path`` (created 0600) in one ``write``, with no fsync.

    For records of a cache that many processes append to (``runs.changes``): with
    ``O_APPEND`` each write lands whole at the end, so appenders never overwrite nor
    interleave with each other on a local filesystem. A symlink, FIFO or device there is
    refused without blocking. Like :func:`replace_unsynced`, not seen by the I/O hook
    (a lost record costs its readers a re-read, never a decision); seen by the recorder
    of ``env`` (else of :data:`DEFAULT_ENV`).

    Raises:
        OSError: the file cannot be opened, or the write failed or was short.
    """
    recorder = env if env is not None else DEFAULT_ENV
    target = os.fspath(path)
    fd = open_regular(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE)
    try:
        recorder._record(IoCall("open", target, append=True))
        written = os.write(fd, data)
        if written != len(data):
            raise OSError(f"short write ({written} of {len(data)} bytes)")
        if recorder.recorder is not None:
            end = os.lseek(fd, 0, os.SEEK_CUR)
            recorder._record(IoCall("write", target, data=bytes(data), offset=end - len(data)))
    finally:
        os.close(fd)


def overwrite_unsynced(fd: int, data: bytes, path: str | os.PathLike[str]) -> None:
    """Write ``data`` at offset 0 of the file behind ``fd`` (one ``pwrite``), with no fsync.

    The in-place counterpart of :func:`replace_unsynced` (a head record moved forward),
    seen by the recorder of :data:`DEFAULT_ENV` as a write, not by the I/O hook.

    Raises:
        OSError: the write failed or was short.
    """
    written = os.pwrite(fd, data, 0)
    if written != len(data):
        raise OSError(f"short write ({written} of {len(data)} bytes)")
    DEFAULT_ENV._record(IoCall("write", os.fspath(path), data=bytes(data)))


def make_dirs_unsynced(path: str | os.PathLike[str]) -> None:
    """Create ``path`` and missing parents (0700) with no fsync, for records that may lag
    (:func:`replace_unsynced`); each new directory is seen by the recorder of
    :data:`DEFAULT_ENV`."""
    target = Path(path)
    if target.is_dir():
        return
    if not target.parent.is_dir():
        make_dirs_unsynced(target.parent)
    try:
        os.mkdir(target, DIR_MODE)
    except FileExistsError:
        return
    DEFAULT_ENV._record(IoCall("mkdir", os.fspath(target)))


def remove_unsynced(path: str | os.PathLike[str]) -> None:
    """Remove a record written by :func:`replace_unsynced`, if it is there; no fsync.

    Not a durable write of any store, so the I/O hook does not see it; the recorder of
    :data:`DEFAULT_ENV` does.
    """
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    DEFAULT_ENV._record(IoCall("unlink", os.fspath(path)))


def _fsync(fd: int) -> None:
    """fsync ``fd``; ``F_FULLFSYNC`` on macOS, where fsync does not reach the platters."""
    if _DARWIN:
        import fcntl  # noqa: PLC0415 - only on macOS

        try:
            fcntl.fcntl(fd, fcntl.F_FULLFSYNC)  # type: ignore[attr-defined,unused-ignore]
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.ENOTTY):
                raise
            os.fsync(fd)  # the filesystem does not support it; fsync is the best we have
        return
    os.fsync(fd)


def _publish_unobserved(
    env: Env,
    prefix: str,
    name: str,
    data: bytes,
    link: str,
    *,
    dir_fd: int | None,
    while_syncing: Callable[[], None] | None,
) -> None:
    """:meth:`Env.publish_with_link` of an Env that nothing observes (no hook, no
    recorder, not a subclass): the same system calls in the same order, with the same
    errors, without a record of each (a sync checkpoint's hot path;
    tests/storage/test_fsio_seam.py checks that both make the same calls). Every name
    is in one directory, so one guard names it when the disk is full.

    With ``dir_fd``, every call names its file relative to that descriptor (``openat``,
    ``renameat``, ``symlinkat``): the kernel then resolves one name instead of the whole
    path four times over (~5 µs of a publish on tmpfs, more for a deep store), and every
    call, the directory's fsync included, acts on the one directory the writer opened.
    """
    at = dir_fd if _AT_CALLS else None
    base = "" if at is not None else prefix  # names relative to ``at``, or whole paths
    tmp = base + _temp_name(name)
    with _disk_full_named(prefix + name):
        fd = os.open(tmp, _O_CREATE_NEW, FILE_MODE, dir_fd=at)
        try:
            try:
                written = os.write(fd, data)
                if written < len(data):
                    view = memoryview(data)[written:]
                    while view:
                        view = view[os.write(fd, view) :]
                if while_syncing is not None:
                    while_syncing()
                _fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, base + name, src_dir_fd=at, dst_dir_fd=at)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=at)
            raise
        link_tmp = base + _temp_name(link)
        try:
            os.symlink(name, link_tmp, dir_fd=at)
        except OSError as exc:
            if exc.errno not in _NO_SYMLINKS:
                raise
            env.atomic_write(prefix + link, name.encode(), sync_dir=False)
        else:
            try:
                os.replace(link_tmp, base + link, src_dir_fd=at, dst_dir_fd=at)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(link_tmp, dir_fd=at)
                raise
        if dir_fd is None:
            env.fsync_dir(prefix)
        else:
            _fsync(dir_fd)


def unlink_names(env: Env, prefix: str, names: Sequence[str]) -> None:
    """Remove the files ``names`` of the directory ``prefix`` (ending with a path
    separator) through ``env``, as its :meth:`~Env.unlink` of each in turn; missing
    ones are fine.

    An Env nothing observes (no hook, no recorder, not a subclass) removes each relative
    to one descriptor of the directory (``unlinkat``): the kernel resolves a name, not
    the whole path, for each of a pack's few hundred superseded files.
    """
    if env.hook is not None or env.recorder is not None or type(env) is not Env:
        for name in names:
            env.unlink(prefix + name)
        return
    dir_fd = open_dir(prefix) if _AT_CALLS and names else None
    try:
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                if dir_fd is None:
                    os.unlink(prefix + name)
                else:
                    os.unlink(name, dir_fd=dir_fd)
    finally:
        if dir_fd is not None:
            os.close(dir_fd)


class Env:
    """The durable I/O of one store: every write-side system call goes through an Env.

    Like LevelDB's ``Env``, one per store (``StoreOptions.env``): a test can give one
    :class:`~afk_local.Store` an Env with its own ``hook`` (fail an fsync, kill the
    process at the N-th call) or ``recorder``. A store made without one uses
    :data:`DEFAULT_ENV`, the process-wide Env that :func:`set_io_hook`,
    :func:`set_io_recorder` and this module's functions (``fsio.atomic_write``...) act
    on, as the kill switch and the crash-state explorer do. A subclass may override any
    method (the methods call each other through ``self``).

    Example:
        >>> calls = []
        >>> env = Env(hook=lambda operation, path: calls.append(operation))
        >>> env.atomic_write("/tmp/afk-doc-env", b"data")
        >>> calls
        ['open', 'write', 'fsync', 'rename', 'fsync']

    Args:
        hook: called before every durable call as ``hook(operation, path)``; it may
            raise to make that call fail, or kill the process.
        recorder: told of every durable call that succeeded (an fsync: as it starts).
    """

    __slots__ = ("hook", "recorder")

    def __init__(self, *, hook: IoHook | None = None, recorder: IoRecorder | None = None) -> None:
        self.hook = hook
        self.recorder = recorder

    def __repr__(self) -> str:
        default = " (the process-wide default)" if self is DEFAULT_ENV else ""
        return f"<fsio.Env hook={self.hook!r} recorder={self.recorder!r}{default}>"

    def _before(self, operation: str, path: str | os.PathLike[str]) -> None:
        hook = self.hook
        if hook is not None:
            hook(operation, os.fspath(path))

    def _record(self, call: IoCall) -> None:
        recorder = self.recorder
        if recorder is not None:
            recorder(call)

    def fsync_fd(self, fd: int, path: str | os.PathLike[str] = "") -> None:
        """Flush ``fd`` to stable storage (``F_FULLFSYNC`` on macOS, where fsync is not enough)."""
        self._before("fsync", path)
        self._record(IoCall("fsync", os.fspath(path)))
        with _disk_full_named(path):
            _fsync(fd)

    def fsync_dir(self, path: str | os.PathLike[str]) -> None:
        """Make the entries of directory ``path`` (renames, new files) durable."""
        if sys.platform == "win32":  # directories cannot be opened for fsync there
            return
        fd = os.open(path, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
        try:
            self.fsync_fd(fd, path)
        finally:
            os.close(fd)

    def write_all(
        self, fd: int, data: bytes | memoryview, path: str | os.PathLike[str] = ""
    ) -> None:
        """Write every byte of ``data`` to ``fd`` (looping over short writes)."""
        self._before("write", path)
        with _disk_full_named(path):
            written = os.write(fd, data)
            if written < len(data):
                view = memoryview(data)[written:]
                while view:
                    view = view[os.write(fd, view) :]
        if self.recorder is not None:
            end = os.lseek(fd, 0, os.SEEK_CUR)  # O_APPEND descriptors write at the end
            call = IoCall("write", os.fspath(path), data=bytes(data), offset=end - len(data))
            self.recorder(call)

    def write_new_file(
        self, path: str | os.PathLike[str], data: bytes, *, sync: bool = True
    ) -> None:
        """Create ``path`` (which must not exist), write ``data``, fsync it, close it."""
        self._before("open", path)
        with _disk_full_named(path):
            fd = os.open(path, _O_CREATE_NEW, FILE_MODE)
        self._record(IoCall("open", os.fspath(path)))
        try:
            self.write_all(fd, data, path)
            if sync:
                self.fsync_fd(fd, path)
        finally:
            os.close(fd)

    def rename(self, src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        """Atomically rename ``src`` over ``dst`` (same directory, or another one of the
        same file system).

        Across directories a rename is two directory changes, and a crash may keep the new
        name and not the removal of the old: both then name one file, and rename(2) of a
        file onto itself does nothing. The old name is then removed here, so moving it
        again after such a crash moves it.
        """
        self._before("rename", dst)
        with _disk_full_named(dst):
            os.replace(src, dst)
        self._record(IoCall("rename", os.fspath(dst), source=os.fspath(src)))
        if os.path.dirname(os.fspath(src)) != os.path.dirname(os.fspath(dst)):
            try:
                left = os.stat(src, follow_symlinks=False)
            except FileNotFoundError:
                return
            if os.path.samestat(left, os.stat(dst, follow_symlinks=False)):
                self.unlink(src)

    def exchange(self, a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
        """Swap the entries ``a`` and ``b`` in one atomic step (``renameat2(RENAME_EXCHANGE)``,
        macOS ``renamex_np(RENAME_SWAP)``): no crash leaves a name without its entry (one
        before the directory fsync may keep the old pair). False, nothing changed: the
        system cannot swap (the caller falls back to two renames)."""
        self._before("rename", b)
        with _disk_full_named(b):
            swapped = _exchange(os.fsencode(a), os.fsencode(b))
        if swapped:
            self._record(IoCall("exchange", os.fspath(b), source=os.fspath(a)))
        return swapped

    def hard_link(self, src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        """Make ``dst`` a new hard link to the file ``src`` (a symlink is linked, not followed)."""
        self._before("link", dst)
        with _disk_full_named(dst):
            os.link(src, dst, follow_symlinks=False)
        self._record(IoCall("link", os.fspath(dst), source=os.fspath(src)))

    def unlink(self, path: str | os.PathLike[str], *, missing_ok: bool = True) -> None:
        """Remove a file; a missing file is fine unless ``missing_ok`` is false."""
        self._before("unlink", path)
        try:
            os.unlink(path)
        except FileNotFoundError:
            if not missing_ok:
                raise
            return
        self._record(IoCall("unlink", os.fspath(path)))

    def atomic_write(
        self,
        path: str | os.PathLike[str],
        data: bytes,
        *,
        sync_dir: bool = True,
        sync_file: bool = True,
    ) -> None:
        """Publish ``data`` at ``path`` all at once: temp file, fsync, rename, fsync directory.

        Readers see the old file or the new one, never a mix. With ``sync_dir=False``
        the caller promises to fsync the directory itself before acknowledging. With
        ``sync_file=False`` (and ``sync_dir=False``) nothing is made durable: a power
        cut may leave the old file, or the new name with its bytes lost or cut short;
        only for a file whose every reader recovers it from a durable copy elsewhere.
        """
        target = os.fspath(path)
        tmp = _temp_sibling(target)
        try:
            self.write_new_file(tmp, data, sync=sync_file)
            self.rename(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        if sync_dir:
            self.fsync_dir(os.path.dirname(target) or ".")

    def atomic_symlink(
        self, target: str, link: str | os.PathLike[str], *, sync_dir: bool = True
    ) -> None:
        """Point ``link`` at ``target`` atomically: symlink to a temp name, rename over.

        ``target`` is a name relative to the link's directory. Where symlinks cannot
        be made, ``link`` becomes a small pointer file holding ``target``, replaced
        atomically; readers accept both forms (see :func:`read_link`).
        """
        link_path = os.fspath(link)
        tmp = _temp_sibling(link_path)
        try:
            self._before("symlink", tmp)
            with _disk_full_named(tmp):
                os.symlink(target, tmp)
            self._record(IoCall("symlink", tmp, source=target))
        except OSError as exc:
            if exc.errno not in _NO_SYMLINKS:
                raise
            self.atomic_write(link_path, target.encode(), sync_dir=sync_dir)
            return
        try:
            self.rename(tmp, link_path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        if sync_dir:
            self.fsync_dir(os.path.dirname(link_path) or ".")

    def publish_with_link(
        self,
        prefix: str,
        name: str,
        data: bytes,
        link: str,
        *,
        dir_fd: int | None = None,
        while_syncing: Callable[[], None] | None = None,
    ) -> None:
        """Durably publish ``data`` as ``prefix + name`` and point ``prefix + link`` at it.

        A sync checkpoint (DESIGN §4.1) in one call: a temp file written and fsynced,
        renamed into place, the link swapped (:meth:`atomic_symlink`), then one fsync of
        the directory, which makes the new name and the new link durable together. The
        same durable calls, hooks and recordings as :meth:`atomic_write`,
        :meth:`atomic_symlink` and :meth:`fsync_dir` one after the other, with less
        overhead; ``dir_fd`` (the directory, opened once by a caller that publishes
        many files there) spares opening the directory for every fsync.

        Args:
            prefix: the directory, ending with a path separator.
            name: the new file's name (it must not exist yet).
            data: its bytes.
            link: the name of the link in the same directory.
            dir_fd: an open descriptor of the directory, or None.
            while_syncing: called after the bytes are written, just before the file's
                fsync: work that can overlap the wait for the disk (it must not touch
                the file, and cannot change what is published).
        """
        if self.hook is None and self.recorder is None and type(self) is Env:
            return _publish_unobserved(
                self, prefix, name, data, link, dir_fd=dir_fd, while_syncing=while_syncing
            )
        tmp = prefix + _temp_name(name)
        self._before("open", tmp)
        with _disk_full_named(tmp):
            fd = os.open(tmp, _O_CREATE_NEW, FILE_MODE)
        try:
            self._record(IoCall("open", tmp))
            try:
                self.write_all(fd, data, tmp)
                if while_syncing is not None:
                    while_syncing()
                self.fsync_fd(fd, tmp)
            finally:
                os.close(fd)
            self.rename(tmp, prefix + name)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self.atomic_symlink(name, prefix + link, sync_dir=False)
        if dir_fd is None:
            self.fsync_dir(prefix)
        else:
            self.fsync_fd(dir_fd, prefix)

    def make_dir(
        self, path: str | os.PathLike[str], *, exist_ok: bool = False, sync_parent: bool = True
    ) -> bool:
        """Create a 0700 directory and fsync its parent so the new entry survives a crash.

        Returns True when the directory was created, False when it existed (``exist_ok``).
        ``sync_parent=False`` for a temporary directory that is published by a rename
        (:meth:`publish_dir`): its own entry never needs to survive a crash.
        """
        target = Path(path)
        self._before("mkdir", target)
        try:
            with _disk_full_named(target.parent):
                os.mkdir(target, DIR_MODE)
        except FileExistsError:
            if exist_ok and target.is_dir() and not target.is_symlink():
                return False
            raise
        self._record(IoCall("mkdir", os.fspath(target)))
        if sync_parent:
            self.fsync_dir(target.parent)
        return True

    def make_dirs(self, path: str | os.PathLike[str]) -> None:
        """Create ``path`` and missing parents, each 0700 and durable."""
        target = Path(path)
        if target.is_dir():
            return
        if not target.parent.is_dir():
            self.make_dirs(target.parent)
        self.make_dir(target, exist_ok=True)

    def publish_dir(self, tmp_dir: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
        """Make a directory built under a temp name appear at ``target`` all at once.

        The directory's entries are fsynced, then it is renamed into place and the
        parent fsynced. Never replaces an existing ``target``: raises FileExistsError.
        """
        self.fsync_dir(tmp_dir)
        if os.path.lexists(target):
            raise FileExistsError(errno.EEXIST, "already exists", os.fspath(target))
        try:
            self.rename(tmp_dir, target)
        except OSError as exc:
            # Linux replaces an *empty* directory silently; a non-empty one fails like this.
            if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                raise FileExistsError(errno.EEXIST, "already exists", os.fspath(target)) from exc
            raise
        self.fsync_dir(os.path.dirname(os.path.abspath(target)))

    def open_append(self, path: str | os.PathLike[str]) -> int:
        """Open (creating 0600) a regular file for appending; returns the descriptor.

        A symlink, FIFO, socket or device there is refused without blocking (see
        :func:`open_regular`).
        """
        self._before("open", path)
        with _disk_full_named(path):
            fd = open_regular(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, FILE_MODE)
        self._record(IoCall("open", os.fspath(path), append=True))
        return fd

    def remove_temp_entry(self, path: str | os.PathLike[str]) -> None:
        """Remove a stale ``.tmp-*`` entry of a crashed writer: a file, a symlink or a directory.

        A directory is removed with everything in it, never following a symlink out of it.
        """
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            self._before("unlink", path)
            import shutil  # noqa: PLC0415 - shutil (bz2, lzma, fnmatch) only to remove a tree

            shutil.rmtree(path)
        else:
            self.unlink(path)

    def truncate(self, fd: int, size: int, path: str | os.PathLike[str] = "") -> None:
        """Cut the file behind ``fd`` to ``size`` bytes and fsync it."""
        self._before("truncate", path)
        os.ftruncate(fd, size)
        self._record(IoCall("truncate", os.fspath(path), offset=size))
        self.fsync_fd(fd, path)


DEFAULT_ENV = Env()
"""The process-wide Env: every store made without an Env of its own uses it."""


def set_io_hook(hook: IoHook | None) -> IoHook | None:
    """Install ``hook`` on :data:`DEFAULT_ENV`, called before every durable I/O call of the
    stores that use it; returns the previous one.

    For fault-injection tests (see ``afk_local.testing``); never needed in normal use.
    A store with an Env of its own (``StoreOptions.env``) is not affected.
    """
    previous, DEFAULT_ENV.hook = DEFAULT_ENV.hook, hook
    return previous


def set_io_recorder(recorder: IoRecorder | None) -> IoRecorder | None:
    """Install ``recorder`` on :data:`DEFAULT_ENV`, to see every durable I/O call with its
    details; returns the previous.

    A mutating call is reported after it succeeded; an fsync as it starts, so a
    write that finished before is known to be covered by it even when threads
    interleave. For the crash-state explorer; never needed in normal use.
    """
    previous, DEFAULT_ENV.recorder = DEFAULT_ENV.recorder, recorder
    return previous


# The module-level functions act on the process-wide Env: for code that has no
# store's Env at hand (the watcher's own files, integrations, tests).
fsync_fd = DEFAULT_ENV.fsync_fd
fsync_dir = DEFAULT_ENV.fsync_dir
write_all = DEFAULT_ENV.write_all
write_new_file = DEFAULT_ENV.write_new_file
rename = DEFAULT_ENV.rename
exchange = DEFAULT_ENV.exchange
hard_link = DEFAULT_ENV.hard_link
unlink = DEFAULT_ENV.unlink
atomic_write = DEFAULT_ENV.atomic_write
atomic_symlink = DEFAULT_ENV.atomic_symlink
publish_with_link = DEFAULT_ENV.publish_with_link
make_dir = DEFAULT_ENV.make_dir
make_dirs = DEFAULT_ENV.make_dirs
publish_dir = DEFAULT_ENV.publish_dir
open_append = DEFAULT_ENV.open_append
remove_temp_entry = DEFAULT_ENV.remove_temp_entry
truncate = DEFAULT_ENV.truncate
