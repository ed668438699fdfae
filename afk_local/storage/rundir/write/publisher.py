"""The publish protocol of one run directory: how a checkpoint file becomes visible.

A checkpoint is published in one call (docs/guarantees.md, 1): a temp file written
and fsynced, renamed to its final name, ``latest`` swapped (a symlink to a temp
name, renamed over ``latest``), and the run directory fsynced once, which makes the
new name and the new link durable together: two fsyncs per checkpoint, the floor for
a durable publish. Every call goes through :mod:`afk_local.storage.fsio`, so the
kill switch and the crash explorer see each one. A publish that failed is taken back
out of sight (:meth:`Publisher.unpublish`), and the temp files a crash left behind
are removed when the run is opened for writing (:meth:`Publisher.remove_temp_files`).

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> from afk_local.storage.format.layout import RunPaths
    >>> paths = RunPaths("r", Path(tempfile.mkdtemp()))
    >>> publisher = Publisher(paths)
    >>> publisher.publish("000000000001.runtime_state.ckpt", b"bytes")
    >>> import os; os.readlink(paths.latest)
    '000000000001.runtime_state.ckpt'
    >>> publisher.close()
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable

from afk_local.storage import fsio
from afk_local.storage.format.layout import LATEST_NAME, RunPaths, scan_checkpoints
from afk_local.storage.fsio import DEFAULT_ENV, Env

log = logging.getLogger("afk_local")


class Publisher:
    """Publishes the checkpoint files of one run directory and swaps its ``latest``.

    Not thread-safe: its writer serialises the calls. It opens the directory once, on
    the first publish, for the directory fsyncs; :meth:`close` lets go of it.

    Args:
        paths: the run directory.
        while_syncing: called after a file's bytes are written, just before its fsync:
            work that overlaps the wait for the disk (it cannot change what is published).
    """

    def __init__(
        self,
        paths: RunPaths,
        env: Env = DEFAULT_ENV,
        while_syncing: Callable[[], None] | None = None,
    ) -> None:
        self.paths = paths
        self._env = env  # the store's I/O seam: every durable call goes through it
        self._dir = str(paths.dir) + os.sep
        self._dir_fd: int | None = None
        self._latest = str(paths.latest)
        self._while_syncing = while_syncing

    def publish(self, name: str, data: bytes) -> None:
        """Durably publish ``data`` as checkpoint file ``name`` and point ``latest`` at it.

        Returns once the file and the directory entries are on stable storage. On an
        error the caller must treat the run as failed (never retry an fsync) and call
        :meth:`unpublish`.
        """
        if self._dir_fd is None:
            self._dir_fd = fsio.open_dir(self._dir)
        self._env.publish_with_link(
            self._dir,
            name,
            data,
            LATEST_NAME,
            dir_fd=self._dir_fd,
            while_syncing=self._while_syncing,
        )

    def unpublish(self, name: str, acknowledged_seq: int) -> None:
        """Take the failed publish of ``name`` back out of sight: the file goes, and
        ``latest`` names checkpoint ``acknowledged_seq`` again (none when 0).

        Best effort only: the writer is dead either way and readers tolerate what
        is left.
        """
        # The failed checkpoint was never acknowledged: the visible run must be the
        # last acknowledged state.
        previous = fsio.read_link(self._latest)
        with contextlib.suppress(OSError):
            self._env.unlink(self._dir + name)
        if previous == name:
            if acknowledged_seq:
                good = next(
                    (f.name for f in scan_checkpoints(self.paths.dir) if f.seq == acknowledged_seq),
                    None,
                )
                if good is not None:
                    with contextlib.suppress(OSError):
                        self._env.atomic_symlink(good, self.paths.latest, sync_dir=False)
            else:
                with contextlib.suppress(OSError):
                    self._env.unlink(self.paths.latest)

    def repoint_latest(self, name: str) -> None:
        """Point ``latest`` at checkpoint file ``name`` durably (an attempt repairing a
        ``latest`` that a kill left behind)."""
        self._env.atomic_symlink(name, self.paths.latest)
        log.info("run %s: latest moved on to %s", self.paths.run_id, name)

    def remove_temp_files(self) -> int:
        """Remove what a crashed publish left in the run directory; returns how many.

        A crash can leave files, symlinks (a half-swapped ``latest``) or whole
        directories; none of them may keep the run from reopening.
        """
        with os.scandir(self.paths.dir) as entries:
            stray = [e.path for e in entries if e.name.startswith(fsio.TEMP_PREFIX)]
        for path in stray:
            self._env.remove_temp_entry(path)
        if stray:
            log.info("run %s: removed %d stray temp file(s)", self.paths.run_id, len(stray))
        return len(stray)

    def close(self) -> None:
        """Let go of the run directory's descriptor (the next publish opens it again)."""
        if self._dir_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._dir_fd)
            self._dir_fd = None


__all__ = ["Publisher"]
