"""Whether a directory's timestamps can stand for its names: ``runs/``'s stamp (device,
inode, mtime, ctime), the filesystems that keep it, and when it has settled.

POSIX changes a directory's mtime and ctime whenever an entry is added, removed or
renamed in it, and ``utime`` cannot set a ctime back. So on a filesystem that keeps
them, a directory whose stamp is the one recorded before it was listed still holds the
names listed then, provided no change could share the recorded mtime: the directory
must have been unchanged for longer than any timestamp granularity when the stamp was
taken (:data:`SETTLED_NS`). :mod:`afk_local.storage.meta_index` uses it to skip listing
``runs/``.
"""

from __future__ import annotations

import functools
import os

from afk_local.clock import wall_ns
from afk_local.storage.format.meta_index_file import Stamp

SETTLED_NS = 2_000_000_000
"""How long a directory must have been unchanged when its stamp is taken for the stamp
to vouch for its names: longer than any filesystem's timestamp granularity (FAT: 2 s)."""

DIR_TIMES_KEPT = frozenset(
    {"bcachefs", "btrfs", "ext2", "ext3", "ext4", "f2fs", "jfs", "overlay", "tmpfs", "xfs", "zfs"}
)
"""Local Linux filesystems that change a directory's mtime and ctime whenever an entry is
added, removed or renamed (a network or FUSE filesystem may cache or not keep them)."""


def dir_stamp(path: str) -> Stamp | None:
    """``path``'s stamp now (not following a symlink), or None when it cannot be had."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)


def vouching(stamp: Stamp | None) -> Stamp | None:
    """``stamp`` if it may stand for the directory's names from now on, else None.

    Call it as the stamp is taken: the directory must have been unchanged for
    :data:`SETTLED_NS` by then, on a filesystem of :data:`DIR_TIMES_KEPT`.
    """
    if stamp is None or wall_ns() - max(stamp[2], stamp[3]) <= SETTLED_NS:
        return None
    return stamp if keeps_dir_times(stamp[0]) else None


@functools.lru_cache(maxsize=16)
def keeps_dir_times(device: int) -> bool:
    """True when ``device`` holds a filesystem of :data:`DIR_TIMES_KEPT` (Linux: read
    from ``/proc/self/mountinfo``; elsewhere, or when unsure, False)."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as mounts:
            lines = mounts.read().splitlines()
    except OSError:
        return False
    wanted = f"{os.major(device)}:{os.minor(device)}"
    for line in lines:
        fields = line.split()
        if len(fields) > 2 and fields[2] == wanted and "-" in fields:
            at = fields.index("-") + 1
            return at < len(fields) and fields[at] in DIR_TIMES_KEPT
    return False


__all__ = ["DIR_TIMES_KEPT", "SETTLED_NS", "dir_stamp", "keeps_dir_times", "vouching"]
