"""Jobs the fan-out tests (Dask, Ray) run on their workers, and the side channels they count with.

Every item is a dict: ``name`` (its files' stem), ``n``, ``steps``, ``dir`` (where the
side-channel files go), and optionally ``hold`` (stop after step 1 of the first
attempt until the test kills this worker), ``fail`` (raise after the first step) or
``sleep_s`` (an expensive item: wait that long before its steps).

Two files per item, each appended with O_APPEND by the job itself, so they count
what really happened whatever the store says:

- ``<name>.calls``: one line per execution of the job's body (``attempt pid``);
- ``<name>.effects``: one line per execution of the journaled step's function.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import afk_local as afk

HOLD_LIMIT_S = 60.0


def append_line(path: str, line: str) -> str:
    """The side effect: append one line (O_APPEND, one write)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)
    return line


def expected(item: dict) -> int:
    """What ``tally(item)`` returns."""
    return sum(i * item["n"] for i in range(item["steps"]))


@afk.durable
def tally(ctx: afk.RunContext, item: dict) -> int:
    """Sum i * n over ``steps`` journaled steps; see the module docstring for hold/fail."""
    out = Path(item["dir"])
    name = item["name"]
    append_line(str(out / f"{name}.calls"), f"{ctx.attempt} {os.getpid()}")
    time.sleep(item.get("sleep_s", 0))
    ctx.state.setdefault("total", 0)
    for i in ctx.iterate(range(item["steps"]), progress=False):
        value = ctx.step("effect", append_line, str(out / f"{name}.effects"), str(i))
        ctx.state["total"] += int(value) * item["n"]
        if item.get("fail"):
            raise ValueError(f"item {name} is broken")
        if item.get("hold") and i == 1 and ctx.attempt == 1:
            hold_until_killed(out / f"{name}.pid")
    return int(ctx.state["total"])


def hold_until_killed(pid_file: Path) -> None:
    """Tell the test which process runs this attempt, then wait for its SIGKILL (bounded)."""
    tmp = pid_file.with_suffix(".tmp")
    tmp.write_text(str(os.getpid()))
    os.replace(tmp, pid_file)
    deadline = time.monotonic() + HOLD_LIMIT_S
    while time.monotonic() < deadline:
        time.sleep(0.05)
    raise RuntimeError(f"nobody killed process {os.getpid()} within {HOLD_LIMIT_S} s")


def lines(path: Path) -> list[str]:
    """The lines of a side-channel file (none when it does not exist)."""
    return path.read_text().splitlines() if path.exists() else []


@afk.durable
def pair(ctx: afk.RunContext, x: int) -> tuple[int, int]:
    """Returns a tuple, which the store keeps as a msgpack array (read back as a list)."""
    return (x, x * x)
