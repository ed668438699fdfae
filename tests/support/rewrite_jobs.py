"""The processes of the rewrite torture test (tests/storage/test_rewrite_torture.py).

Importable as ``rewrite_jobs`` (children get tests/support on PYTHONPATH):

Both long-running ones take ``die_at``: with N > 0 the process SIGKILLs itself right
before its N-th durable I/O call (through the fsio hook), so a kill lands inside a
pack, a merge or a gc rather than wherever a timer happens to fall; 0 leaves the kill
to the parent.

- :func:`writer`: writes checkpoints of run ``r`` with ``pack_loose_limit=2``,
  so it packs as it goes, and prints ``ack SEQ I`` once each checkpoint call returned;
- :func:`maintainer`: loops gc, pack and verify over the store until killed;
- :func:`cold_check`: a new process's verdict on the store, as one JSON line.

Payloads are a pure function of ``I`` (:func:`payload`), so the parent knows what each
acknowledged checkpoint must hold.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any

import afk_local as afk
from afk_local.storage import fsio
from afk_local.storage.ops.retention import RetentionPolicy

RUN = "r"
KEY = "torture key"
POLICY = RetentionPolicy(keep_runtime_states=4)
"""Four newest runtime states: with two loose files at most, the oldest kept ones are
packed deltas whose bases go (gc rewrites them, issue 33's path)."""


def payload(i: int) -> dict[str, Any]:
    """What checkpoint number ``i`` holds: a growing state, so most are deltas."""
    return {"i": i, "log": [f"line {j} " * 8 for j in range(i % 23 + 1)]}


def _die_at(calls: str) -> None:
    """SIGKILL this process right before its ``calls``-th durable I/O call (0: never)."""
    limit = int(calls)
    if limit <= 0:
        return
    seen = [0]

    def hook(_operation: str, _path: str) -> None:
        seen[0] += 1
        if seen[0] >= limit:
            os.kill(os.getpid(), signal.SIGKILL)

    fsio.set_io_hook(hook)


def _store(root: str, keyed: bool) -> afk.Store:
    store = afk.Store(root, key=KEY if keyed else None, lock_timeout=30)
    store.pack_loose_limit = 2
    return store


def _open_run(store: afk.Store) -> afk.RunWriter:
    """Resume run ``r`` (waiting for the maintainer's lock), or create it the first time."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return store.resume_writer(RUN) if store.exists(RUN) else store.create(RUN)
        except afk.errors.RunLockedError:  # create does not wait: a killed create's leftovers
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def writer(root: str, keyed: str, first: str, die_at: str = "0", pause: str = "0") -> None:
    """Checkpoint ``first``, ``first + 1``, ... until killed, a step marker between
    (``pause`` seconds after each pair: a run that grows at a human pace)."""
    store = _store(root, keyed == "1")
    _die_at(die_at)
    with _open_run(store) as run:
        i = int(first)
        while True:
            time.sleep(float(pause))
            run.checkpoint("step_started", {"state": "running", "message_count": i}, step=i)
            written = run.checkpoint("runtime_state", payload(i), step=i)
            sys.stdout.write(f"ack {written.seq} {i}\n")
            sys.stdout.flush()
            i += 1


def maintainer(root: str, keyed: str, die_at: str = "0") -> None:
    """gc, pack, verify, over and over (each waits for the writer's lock or skips the run)."""
    store = _store(root, keyed == "1")
    _die_at(die_at)
    parent = os.getppid()
    while os.getppid() == parent:  # a test runner killed without it: stop, never spin on
        store.gc(POLICY)
        store.pack()
        if store.exists(RUN):
            store.open(RUN).verify()


def cold_check(root: str, keyed: str, seq: str, i: str) -> None:
    """Print ``{"problems": [...]}``: the newest acknowledged checkpoint ``seq`` must hold
    ``payload(i)``, read by a new reader; resume_state() must work; verify must pass."""
    store = _store(root, keyed == "1")
    problems: list[str] = []
    want_seq, want_i = int(seq), int(i)
    try:
        got = store.open(RUN).get(want_seq).payload
        if got != payload(want_i):
            problems.append(f"checkpoint {want_seq} holds another payload")
    except afk.errors.AfkLocalError as exc:
        problems.append(f"checkpoint {want_seq}: {type(exc).__name__}: {exc}")
    try:
        state = store.open(RUN).resume_state()
        if state.latest_seq < want_seq:
            problems.append(f"resume_state() sees checkpoint {state.latest_seq}, not {want_seq}")
    except afk.errors.AfkLocalError as exc:
        problems.append(f"resume_state(): {type(exc).__name__}: {exc}")
    try:
        report = store.open(RUN).verify()
        problems += [f"verify: {p.path}: {p.reason}" for p in report.problems]
    except afk.errors.AfkLocalError as exc:
        problems.append(f"verify: {type(exc).__name__}: {exc}")
    sys.stdout.write(json.dumps({"problems": problems}) + "\n")
