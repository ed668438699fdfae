"""A whole-program fuzzer: random programs, real faults, a reference model, liveness.

In the spirit of FoundationDB's simulation and Restate's verification runner: each
program (:mod:`.program`) runs durable jobs made of steps, idempotent steps, steps that
fail once, ``ctx.iterate`` loops, checkpoints, sleeps, parks and pauses, in every
durability mode, interleaved with answers, settlements, ``gc``, ``pack``, ``fork``,
export and import, ``verify`` and ``rm``, under SIGKILLs of real child processes and
power cuts built by the crash explorer's disk model; then, with the faults stopped,
every run must finish, and the store must agree with the model (:mod:`.execute`).

Run it as ``python -m afk_local.testing.fuzz --seed S --programs N [--torture]``, or::

    from afk_local.testing.fuzz import fuzz
    assert fuzz("2026-11-28", programs=50).ok

A failing program is named by its seed and index (``--seed S --program I`` replays it
alone) and shrunk to fewer actions and instructions that still fail.
docs/guarantees.md ("The whole-program fuzzer") describes what it checks.
"""

from __future__ import annotations

from afk_local.testing.fuzz.execute import run_program
from afk_local.testing.fuzz.fuzzer import Failure, FuzzReport, fuzz, shrink
from afk_local.testing.fuzz.program import Program, generate

__all__ = ["Failure", "FuzzReport", "Program", "fuzz", "generate", "run_program", "shrink"]
