"""The effect journal as a run's writer sees it: a seam, not an import.

The journal (:mod:`afk_local.journal`) sits one layer above storage: it is built on
storage's I/O seam and format modules only. A run's writer still hands out the run's
journal (``RunWriter.effects``, the public API), so it opens it through the opener
registered here instead of importing it. ``afk_local/__init__.py``, the composition
root above every layer, registers the journal's opener when the package is imported;
since Python imports a package before any of its modules, every program that can
reach a :class:`~afk_local.storage.rundir.write.writer.RunWriter` has one.

This is the same inversion the rest of the package uses to call up (the reader's
notebook view, the runner's observers): the lower layer declares what it needs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # ``import afk_local`` loads this module: it must not load pathlib
    from pathlib import Path

    from afk_local.storage.format.codec import RecordCodec
    from afk_local.storage.fsio import Env
    from afk_local.storage.rundir.mirror import RunMirror


class EffectLog(Protocol):
    """What a run's writer needs of the journal it hands out (``afk_local.journal.Journal``)."""

    def __len__(self) -> int:
        """How many records are durable in the journal."""
        ...

    def close(self) -> None:
        """Close the journal's file (the writer does so when it closes)."""
        ...

    @property
    def failed(self) -> BaseException | None:
        """The write or fsync error that made the journal refuse appends, if any."""
        ...


class JournalOpener(Protocol):
    """Opens a run's ``effects.log`` for writing (repairing a torn tail)."""

    def __call__(
        self,
        path: Path,
        run_id: str,
        *,
        record_codec: RecordCodec,
        listener: RunMirror | None,
        on_durable: Callable[[int, bytes], None] | None,
        env: Env,
    ) -> EffectLog:
        """Open the journal at ``path`` for run ``run_id``, writing through ``env``."""
        ...


_opener: JournalOpener | None = None


def register_journal_opener(opener: JournalOpener) -> None:
    """Make ``opener`` the way every run's writer opens its effect journal."""
    global _opener  # noqa: PLW0603 - one opener per process, set by the composition root
    _opener = opener


def open_effect_log(
    path: Path,
    run_id: str,
    *,
    record_codec: RecordCodec,
    listener: RunMirror | None,
    on_durable: Callable[[int, bytes], None] | None,
    env: Env,
) -> EffectLog:
    """Open run ``run_id``'s journal for writing through the registered opener."""
    if _opener is None:  # only if afk_local/__init__.py was bypassed
        raise RuntimeError("no effect journal is registered: import afk_local first")
    return _opener(
        path,
        run_id,
        record_codec=record_codec,
        listener=listener,
        on_durable=on_durable,
        env=env,
    )
