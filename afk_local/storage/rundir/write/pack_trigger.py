"""When a writer folds its older loose checkpoint files into a pack.

Past ``pack_loose_limit`` loose files, a writer packs the older ones (the packer is
:func:`~afk_local.storage.rundir.packing.pack_run`) at the next keyframe, or at twice
the limit whatever the checkpoint. The delta chains still being extended stay loose
back to their keyframes, but never more than half the limit: so the newest
checkpoints decode from loose files. With a remote mirror, what is packed away must
have been uploaded first (the mirror uploads published files by name).

A writer calls it after each acknowledged checkpoint::

    trigger.published(record.seq, delta_policy.keyframe_written, name, frame)

It keeps the bytes of the files it counts (up to :data:`MAX_KEPT_FRAME_BYTES`), so a
pack takes them from memory instead of reading back what the writer just wrote.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from afk_local.storage.format.codec import RecordCodec
from afk_local.storage.format.layout import RunPaths
from afk_local.storage.fsio import DEFAULT_ENV, Env
from afk_local.storage.rundir.delta_policy import DeltaPolicy
from afk_local.storage.rundir.mirror import RunMirror
from afk_local.storage.rundir.packing import PackReport, pack_run

log = logging.getLogger("afk_local")

MAX_KEPT_FRAME_BYTES = 1 << 20
"""The most bytes of its own loose files a writer keeps in memory for its next pack (so
that packing does not read back what it just wrote); files past it are read from disk.
A 9 KB state's 256 loose files take ~100 KB; the LangGraph saver keeps up to 32 writers
open, so at most 32 MiB in all."""

MIRROR_CATCH_UP_S = 30.0
"""How long a mirrored writer waits, once per pack, for the remote to hold what it packs."""


def _ignore(exc: BaseException) -> None:
    pass


class PackTrigger:
    """Decides when a writer packs, and packs. Not thread-safe: its writer serialises calls.

    Args:
        paths: the run directory (its lock is held by the writer).
        record_codec: the store's codec (its key signs the packs).
        limit: loose files after which the older ones are packed; 0: never on its own.
        loose: loose checkpoint files in the run directory now.
        delta: the writer's delta policy (which chains are still being extended).
        mirror: the run's remote mirror, if any.
        on_failure: told of a failed pack after a checkpoint: the checkpoint stays
            acknowledged, and the writer refuses further writes.
    """

    def __init__(
        self,
        paths: RunPaths,
        record_codec: RecordCodec,
        *,
        limit: int,
        loose: int,
        delta: DeltaPolicy,
        mirror: RunMirror | None = None,
        env: Env = DEFAULT_ENV,
        on_failure: Callable[[BaseException], None] = _ignore,
    ) -> None:
        self._env = env
        self.paths = paths
        self._codec = record_codec
        self.limit = limit
        self.loose = loose
        """Loose checkpoint files in the run directory (as far as this writer knows)."""
        self._delta = delta
        self._mirror = mirror
        self._on_failure = on_failure
        self._frames: dict[int, tuple[str, bytes]] = {}
        """The loose files this writer published since its last pack, by seq: name and
        the exact bytes (bounded by :data:`MAX_KEPT_FRAME_BYTES`)."""
        self._frame_bytes = 0

    def published(
        self, seq: int, keyframe: bool, name: str | None = None, frame: bytes | None = None
    ) -> None:
        """Count checkpoint ``seq`` (a ``keyframe`` or not) in, and pack if it is time.

        ``name`` and ``frame``: the file just published and its bytes, kept for the pack
        that folds it (while the writer holds the run's lock, nothing else writes them).
        """
        self.loose += 1
        if (
            frame is not None
            and name is not None
            and self.limit
            and self._frame_bytes + len(frame) <= MAX_KEPT_FRAME_BYTES
        ):
            self._frames[seq] = (name, frame)
            self._frame_bytes += len(frame)
        if self.limit and self.loose >= self.limit and (keyframe or self.loose >= 2 * self.limit):
            self._pack_older(seq)

    def _pack_older(self, seq: int) -> None:
        """Fold the older loose files into a pack, after checkpoint ``seq``.

        Called after a checkpoint was acknowledged: a failure cannot take it back, so it
        is logged and handed to ``on_failure``.
        """
        half = max(1, self.limit // 2)
        recent = seq - half
        keep_from = max(min(self._delta.keyframes_after(recent), default=seq), recent + 1)
        if self._mirror is not None and self._mirror.uploaded_seq() < keep_from - 1:
            # Never wait on the network here (this is the checkpoint path): what the
            # mirror has not uploaded yet stays loose until a later keyframe.
            log.debug("run %s: not packing yet, the mirror is behind", self.paths.run_id)
            return
        try:
            report = pack_run(
                self.paths,
                self._codec,
                keep_from=keep_from,
                sync_removals=False,
                measure=False,
                images=self._images(),
                env=self._env,
            )
        except Exception as exc:
            log.error("run %s: packing older checkpoints failed: %s", self.paths.run_id, exc)
            self._on_failure(exc)
            return
        self.loose = report.loose_left
        self._forget_frames(below=keep_from)  # packed, or left loose for a later pack

    def pack(self, *, full: bool = True) -> PackReport:
        """Fold every loose checkpoint file but the newest into packs, now.

        With ``full``, merge the run's packs too. A failed pack is handed to
        ``on_failure`` and raised; a mirror that cannot catch up only raises.
        """
        if self._mirror is not None:  # what is packed away must be on the remote first
            self._mirror.flush(MIRROR_CATCH_UP_S)
        try:
            report = pack_run(
                self.paths, self._codec, full=full, images=self._images(), env=self._env
            )
        except BaseException as exc:
            self._on_failure(exc)
            raise
        self.loose = report.loose_left
        self.forget_frames()
        return report

    def forget_frames(self) -> None:
        """Drop the kept bytes of the loose files: the next pack reads them from disk.

        Whoever rewrites or deletes this writer's loose files calls it first (the
        LangGraph saver's prune, through the writer's ``loosen_head``).
        """
        self._frames.clear()
        self._frame_bytes = 0

    def _images(self) -> dict[str, bytes]:
        return dict(self._frames.values())

    def _forget_frames(self, *, below: int) -> None:
        self._frames = {seq: kept for seq, kept in self._frames.items() if seq >= below}
        self._frame_bytes = sum(len(frame) for _, frame in self._frames.values())


__all__ = ["MAX_KEPT_FRAME_BYTES", "MIRROR_CATCH_UP_S", "PackTrigger"]
