"""Power cuts for the fuzzer, built by the crash explorer's model of the disk.

:func:`recording` records every durable I/O call made under a directory (and stamps
the ledger with the recording's position); :func:`cut_power` then picks a random call
of the recording and a random crash state the model allows after it (which unsynced
data and directory entries survived), and rebuilds the directory as that state: the
disk a power cut at that instant may leave.
"""

from __future__ import annotations

import contextlib
import random
import shutil
from collections.abc import Iterator
from pathlib import Path

from afk_local.storage import fsio
from afk_local.testing.crashsim.disk import Tree, write_tree
from afk_local.testing.crashsim.model import DiskModel
from afk_local.testing.crashsim.mutants import MUTANTS
from afk_local.testing.crashsim.trace import Op, Recorder
from afk_local.testing.fuzz.jobs import set_position


@contextlib.contextmanager
def recording(base: Path) -> Iterator[Recorder]:
    """Record every durable I/O call under ``base`` while inside."""
    recorder = Recorder(base)
    previous = fsio.set_io_recorder(recorder)
    previous_position = set_position(lambda: len(recorder))
    try:
        yield recorder
    finally:
        fsio.set_io_recorder(previous)
        set_position(previous_position)


def cut_power(
    base: Path, initial: Tree, ops: list[Op], rng: random.Random, mutant: str | None = None
) -> int:
    """Rebuild ``base`` (whose tree was ``initial`` before ``ops``) as a random crash state
    after a random call; returns how many calls came before the cut.

    Args:
        mutant: a kind mutant of the explorer (:data:`~.crashsim.MUTANTS`): the fsyncs of
            that kind are treated as never made.
    """
    at = rng.randint(0, len(ops))
    model = DiskModel(initial, ignored_fsyncs=frozenset({MUTANTS[mutant]} if mutant else ()))
    for op in ops[:at]:
        model.apply(op)
    frontier = model.frontier(at, ops[at - 1] if at else None)
    tree = frontier.tree(frontier.random_choice(rng))
    shutil.rmtree(base)
    write_tree(tree, base)
    return at


__all__ = ["cut_power", "recording"]
