"""When a checkpoint is written as a delta, and against which base.

A writer keeps, per phase, the newest checkpoint it wrote of that phase: the base of
that phase's next delta (docs/format.md, "Deltas"). A checkpoint is a keyframe (a
full frame) when its phase has no base yet (the first checkpoint of every attempt:
after a resume nothing is remembered), after ``max_chain`` deltas in a row, when its
base is too large to be a dictionary, or when the delta would be larger than
``delta_fraction`` of an estimated full frame. The base just remembered is handed to
:class:`~afk_local.storage.rundir.delta_prefetch.DeltaPrefetch`, which prepares its
compressor while the writer waits for the disk.

Example:
    >>> policy = DeltaPolicy(max_chain=2)
    >>> raw = b"state " * 500
    >>> _ = policy.frame(1, "runtime_state", raw, None)
    >>> policy.keyframe_written
    True
    >>> _ = policy.frame(2, "runtime_state", raw + b"more", None)
    >>> policy.keyframe_written
    False
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, NamedTuple

from afk_local.storage.format import codec
from afk_local.storage.format.records import Phase

if TYPE_CHECKING:
    from afk_local.storage.rundir.delta_prefetch import DeltaPrefetch

_LAST_PHASE = Phase.RUN_TERMINAL.value

DEFAULT_MAX_CHAIN = 32
"""Deltas in a row after which the next checkpoint of a phase is a keyframe."""

DEFAULT_DELTA_FRACTION = 0.5
"""A delta larger than this fraction of an (estimated) full frame is written as a keyframe."""

MAX_CHAINS = 16
"""Phases whose newest record a writer keeps as a delta base (the least recently used
is dropped)."""


class Chain(NamedTuple):
    """The newest checkpoint of one phase: the base of that phase's next delta."""

    raw: bytes
    seq: int
    length: int
    """Deltas since the keyframe (0: this checkpoint is the keyframe)."""
    keyframe: int
    """The seq of the chain's keyframe."""


class DeltaPolicy:
    """Frames a writer's checkpoints: a delta against its phase's base, or a keyframe.

    Not thread-safe: the writer calls it under its own serialisation. Empty when
    made, so the first checkpoint of every phase after an open (a resume) is a
    keyframe.

    Args:
        max_chain: deltas after which a phase's next checkpoint is a keyframe.
        delta_fraction: a delta over this fraction of an estimated full frame is
            dropped and the checkpoint written as a keyframe.
        level: the zstd level of frames and deltas.
    """

    def __init__(
        self,
        *,
        max_chain: int = DEFAULT_MAX_CHAIN,
        delta_fraction: float = DEFAULT_DELTA_FRACTION,
        level: int = codec.DEFAULT_LEVEL,
    ) -> None:
        self._max_chain = max_chain
        self._delta_fraction = delta_fraction
        self._level = level
        self._chains: OrderedDict[str, Chain] = OrderedDict()
        # queue and a thread pool: loaded by a writer, not by a reader of the options
        from afk_local.storage.rundir.delta_prefetch import DeltaPrefetch  # noqa: PLC0415

        self.prefetch: DeltaPrefetch = DeltaPrefetch(level)
        """Prepares the next delta's compressor; its ``start`` runs while the disk syncs."""
        self._key_ratio = 0.3  # full frame / raw of the last keyframe: a delta's yardstick
        self.keyframe_written = False
        """True when the last frame made was a keyframe."""

    def frame(self, seq: int, phase: str, raw: bytes, mac: bytes | None) -> bytes:
        """The checkpoint frame of ``raw`` (checkpoint ``seq`` of ``phase``), remembered as
        that phase's next base. ``mac`` is the record's signature, or None."""
        # The base is the newest earlier checkpoint of the same phase, not simply the
        # previous checkpoint: in the agent protocol a large runtime_state follows a
        # tiny phase payload, and a delta against that is as big as a keyframe.
        chain = self._chains.pop(phase, None)
        if (
            chain is not None
            and chain.length < self._max_chain
            and len(chain.raw) <= codec.MAX_DELTA_BASE_BYTES
        ):
            body = self.prefetch.compress(phase, chain.raw, raw)
            if len(body) <= self._delta_fraction * self._key_ratio * len(raw) + 64:
                self._remember(phase, Chain(raw, seq, chain.length + 1, chain.keyframe))
                self.keyframe_written = False
                return codec.pack_frame(
                    codec.KIND_CHECKPOINT,
                    body,
                    flags=codec.FLAG_DELTA,
                    base_seq=chain.seq,
                    mac=mac,
                )
        body = codec.compress(raw, level=self._level)
        self._key_ratio = len(body) / max(len(raw), 1)
        self._remember(phase, Chain(raw, seq, 0, seq))
        self.keyframe_written = True
        return codec.pack_frame(codec.KIND_CHECKPOINT, body, mac=mac)

    def _remember(self, phase: str, chain: Chain) -> None:
        self._chains[phase] = chain
        if phase == _LAST_PHASE:  # a run's last write: no next delta to prepare a compressor for
            self.prefetch.forget(phase)
        elif chain.length < self._max_chain and len(chain.raw) <= codec.MAX_DELTA_BASE_BYTES:
            self.prefetch.submit(phase, chain.raw)
        else:
            self.prefetch.forget(phase)
        while len(self._chains) > MAX_CHAINS:
            self.prefetch.forget(self._chains.popitem(last=False)[0])

    def chain(self, phase: str) -> Chain | None:
        """The base ``phase``'s next checkpoint would be a delta of, if any."""
        return self._chains.get(phase)

    def keyframes_after(self, seq: int) -> list[int]:
        """The keyframes of the chains still extended past ``seq``: what a decode of their
        newest checkpoints reads from, so packing leaves them loose."""
        return [c.keyframe for c in self._chains.values() if c.seq > seq]


__all__ = ["DEFAULT_DELTA_FRACTION", "DEFAULT_MAX_CHAIN", "MAX_CHAINS", "Chain", "DeltaPolicy"]
