"""The durable jobs the fuzzer runs: one interpreter of a generated program per durability mode.

A program is plain data (lists of strings and ints, so it travels to a child process
as the job's arguments): each instruction is one of

- ``["step", name, n]``: ``ctx.step(name, ...)``, not idempotent (in doubt: raise);
- ``["istep", name, n]``: the same, ``idempotent=True`` (in doubt: retried, same key);
- ``["flaky", name, n]``: a step whose first execution raises: the run fails, and
  the next attempt calls it again;
- ``["iterate", name, count]``: ``ctx.iterate(range(count))``, each item one step whose
  value goes into ``ctx.state["acc"]``;
- ``["checkpoint", name]``: set a state key, ``ctx.checkpoint()``;
- ``["sleep", name]``: a short durable ``ctx.sleep`` that does not park;
- ``["park", name]``: a short ``ctx.sleep`` that parks the run (``RunSleeping``);
- ``["pause", name]``: ``ctx.pause(name)``; the answer is :func:`answer_for` ``(name)``.

Every side effect appends one line to the *ledger*, a file outside the store that
stands for the world (a crash of the store's disk does not roll it back): the
idempotency key it was handed, the run, the step's name, ``ok`` or ``error``, and the
position of the crash explorer's recording when one runs in this process.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from afk_local.runner.run.durable_function import durable
from afk_local.runner.run.run_context import RunContext

PARK_SECONDS = 0.005
"""How long a ``park`` instruction sleeps (it parks at once: ``park_after=0``)."""

_position: list[Callable[[], int | None]] = [lambda: None]
_running: list[str] = [""]
"""The run whose job is interpreting now (noted in the ledger; never an effect's input,
which must be the same in a fork of the run)."""


def set_position(position: Callable[[], int | None]) -> Callable[[], int | None]:
    """Stamp ledger lines with ``position()`` (the recording's length); returns the previous."""
    previous, _position[0] = _position[0], position
    return previous


def value_of(name: str, n: int) -> str:
    """What the side effect ``name`` returns (and the model expects)."""
    return f"{name}={n * 7 + 1}"


def answer_for(prompt: str) -> str:
    """The answer the fuzzer gives to ``ctx.pause(prompt)``."""
    return f"answer:{prompt}"


def read_ledger(path: str) -> list[dict[str, Any]]:
    """Every line of the ledger at ``path`` (a torn last line, from a kill, is skipped)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    entries = []
    for line in lines:
        try:
            entries.append(json.loads(line))
        except ValueError:
            continue
    return entries


def _record(ledger: str, entry: dict[str, Any]) -> None:
    line = (json.dumps({**entry, "pos": _position[0]()}) + "\n").encode()
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)  # one write: a kill leaves the whole line or none of it
    finally:
        os.close(fd)


def effect(ledger: str, name: str, n: int, *, idempotency_key: str) -> str:
    """A side effect that succeeds: noted in the ledger, returns :func:`value_of`."""
    value = value_of(name, n)
    entry = {"key": idempotency_key, "run": _running[0], "name": name, "value": value}
    _record(ledger, {**entry, "status": "ok"})
    return value


def flaky_effect(ledger: str, name: str, n: int, *, idempotency_key: str) -> str:
    """A side effect whose first execution (per idempotency key) fails."""
    failed = any(
        e["key"] == idempotency_key and e["status"] == "error" for e in read_ledger(ledger)
    )
    if not failed:
        entry = {"key": idempotency_key, "run": _running[0], "name": name, "status": "error"}
        _record(ledger, entry)
        raise ValueError(f"{name}: fails the first time")
    return effect(ledger, name, n, idempotency_key=idempotency_key)


def _interpret(ctx: RunContext, program: list[list[Any]], ledger: str) -> dict[str, Any]:
    _running[0] = ctx.run_id
    top: list[str] = []
    for instruction in program:
        op, name = instruction[0], instruction[1]
        if op in ("step", "istep"):
            idempotent = op == "istep"
            top.append(ctx.step(name, effect, ledger, name, instruction[2], idempotent=idempotent))
        elif op == "flaky":
            top.append(ctx.step(name, flaky_effect, ledger, name, instruction[2], idempotent=False))
        elif op == "iterate":
            for i in ctx.iterate(range(instruction[2]), name=name, progress=False):
                item = f"{name}.{i}"
                got = ctx.step(item, effect, ledger, item, i, idempotent=False)
                ctx.state.setdefault("acc", []).append(got)
        elif op == "checkpoint":
            ctx.state[name] = True
            ctx.checkpoint()
        elif op == "sleep":
            ctx.sleep(0.001, park_after=None)
        elif op == "park":
            ctx.sleep(PARK_SECONDS, park_after=0)
        elif op == "pause":
            top.append(ctx.pause(name))
        else:
            raise ValueError(f"unknown instruction {instruction!r}")
    return {"top": top, "acc": list(ctx.state.get("acc", []))}


@durable(durability="sync")
def program_sync(ctx: RunContext, program: list[list[Any]], ledger: str) -> dict[str, Any]:
    """Interpret ``program`` (module docstring), ``sync`` checkpoints."""
    return _interpret(ctx, program, ledger)


@durable(durability="async")
def program_async(ctx: RunContext, program: list[list[Any]], ledger: str) -> dict[str, Any]:
    """Interpret ``program``, ``async`` write-behind checkpoints."""
    return _interpret(ctx, program, ledger)


@durable(durability="exit")
def program_exit(ctx: RunContext, program: list[list[Any]], ledger: str) -> dict[str, Any]:
    """Interpret ``program``, checkpoints kept until a pause, the end or an error."""
    return _interpret(ctx, program, ledger)


JOBS = {"sync": program_sync, "async": program_async, "exit": program_exit}
"""The interpreter job of each durability mode."""

__all__ = [
    "JOBS",
    "PARK_SECONDS",
    "answer_for",
    "effect",
    "flaky_effect",
    "program_async",
    "program_exit",
    "program_sync",
    "read_ledger",
    "set_position",
    "value_of",
]
