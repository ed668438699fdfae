"""AfkLocalSaver under SIGKILL: a 30-step graph killed at random points resumes to the same state.

Real child processes, killed with SIGKILL (no mocked crashes). Every step is one
superstep with two parallel tasks: ``effect`` (a side effect: it appends the step
number to a file outside the store) and ``think`` (pure, a few milliseconds
slower). The graph runs with ``durability="sync"``: each superstep's checkpoint
is on disk before the next superstep starts, and pending writes of finished
tasks are fsynced as each task finishes.

To keep the default run short, one child process does two things: it resumes
the thread the previous child was killed in, then starts a fresh thread and is
killed in it. N trials need N + 1 processes.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip(
    "langgraph", reason="LangGraph not installed: pip install 'afk_local[test-all]'"
)

from proc import spawn

import afk_local as afk
from afk_local.integrations.langgraph import thread_run_id

STEPS = 30

CHILD = r"""
import json, operator, os, sys, time
from typing import Annotated, TypedDict

from langgraph.graph import END, START, StateGraph

from afk_local.integrations.langgraph import AfkLocalSaver

root, effects_dir, resume_thread, new_thread, final = sys.argv[1:6]
STEPS = 30


class State(TypedDict):
    count: int
    log: Annotated[list[str], operator.add]
    thoughts: Annotated[list[str], operator.add]


def effect(state, config):
    n = state["count"] + 1
    thread = config["configurable"]["thread_id"]
    fd = os.open(os.path.join(effects_dir, thread), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.write(fd, f"{n}\n".encode())
    os.close(fd)
    print(f"ACK {thread} {n}", flush=True)
    return {"count": n, "log": [f"effect {n}"]}


def think(state):
    time.sleep(0.003)
    return {"thoughts": [f"thought at {state['count']}"]}


def route(state):
    return END if state["count"] >= STEPS else ["effect", "think"]


builder = StateGraph(State)
builder.add_node("effect", effect)
builder.add_node("think", think)
builder.add_edge(START, "effect")
builder.add_edge(START, "think")
builder.add_conditional_edges("effect", route, ["effect", "think", END])


def finish(graph, thread):
    config = {"configurable": {"thread_id": thread}, "recursion_limit": 200}
    if not graph.get_state(config).values:
        start = {"count": 0, "log": [], "thoughts": []}
        graph.invoke(start, config, durability="sync")
    else:
        # Not `if snapshot.next`: when every task of the interrupted superstep had
        # finished, LangGraph reports no next task although the run is not done.
        graph.invoke(None, config, durability="sync")
    return graph.get_state(config).values


with AfkLocalSaver.from_path(root) as saver:
    graph = builder.compile(checkpointer=saver)
    if resume_thread != "-":
        finish(graph, resume_thread)
        print(f"DONE {resume_thread}", flush=True)
    if new_thread != "-":
        finish(graph, new_thread)
        print(f"DONE {new_thread}", flush=True)
    if final != "-":
        threads = json.loads(final)
        states = {t: finish(graph, t) for t in threads}
        print("STATES " + json.dumps(states), flush=True)
"""


def _kill_on(proc, marker: str, delay: float, timeout: float = 120) -> tuple[list[str], str]:
    """Read the child's lines; SIGKILL it ``delay`` seconds after the line ``marker``."""
    watchdog = threading.Timer(timeout, proc.kill)
    watchdog.start()
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.rstrip("\n") == marker:
                time.sleep(delay)
                proc.send_signal(signal.SIGKILL)
                break
    finally:
        watchdog.cancel()
    proc.wait()
    stderr = proc.stderr.read() if proc.stderr else ""
    return lines, stderr


def test_sigkilled_graph_resumes_to_the_uninterrupted_state(tmp_path, trials):
    count = trials(5, 200)  # each trial starts an interpreter that imports langgraph
    seed = int(os.environ.get("AFK_TEST_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    root, effects = tmp_path / "store", tmp_path / "effects"
    effects.mkdir()
    killed = 0
    previous = "-"
    for trial in range(count):
        thread = f"trial-{trial}"
        target = rng.randint(1, STEPS)
        delay = rng.choice([0.0, rng.uniform(0, 0.004), rng.uniform(0, 0.02)])
        proc = spawn(CHILD, str(root), str(effects), previous, thread, "-")
        lines, stderr = _kill_on(proc, f"ACK {thread} {target}", delay)
        assert proc.returncode in (0, -signal.SIGKILL), f"seed {seed}: {stderr}"
        if previous != "-":
            assert f"DONE {previous}" in lines, f"seed {seed}: {stderr}"
        killed += proc.returncode == -signal.SIGKILL
        previous = thread

    threads = [f"trial-{i}" for i in range(count)]
    final = json.dumps([*threads, "reference"])
    proc = spawn(CHILD, str(root), str(effects), previous, "reference", final)
    lines, stderr = _kill_on(proc, "never", 0.0)
    assert proc.returncode == 0, f"seed {seed}: {stderr}"
    (states_line,) = [line for line in lines if line.startswith("STATES ")]
    states = json.loads(states_line[len("STATES ") :])

    reference = states["reference"]
    assert reference == _expected_state(effects)
    duplicates = {}
    for thread in threads:
        assert states[thread] == reference, f"seed {seed}: {thread} differs"
        # The side effect ran for every step; only the step in flight at the kill
        # may have run twice (its task had not finished when the process died).
        runs = Counter(int(x) for x in (effects / thread).read_text().split())
        assert set(runs) == set(range(1, STEPS + 1)), f"seed {seed}: {thread}"
        duplicates[thread] = sum(n - 1 for n in runs.values())
        assert duplicates[thread] <= 1, f"seed {seed}: {thread} repeated {runs}"
        store = afk.Store(root)
        assert store.open(thread_run_id(thread)).verify().ok
    print(
        f"\nlanggraph crash trials: {count} (seed {seed}), killed {killed}, "
        f"side effects repeated {sum(duplicates.values())} time(s) in total"
    )
    assert killed >= count // 2  # most kills land before the thread finishes


def _expected_state(effects: Path) -> dict:
    """What the reference thread (start to end in one process, no kill) must hold."""
    runs = Counter(int(x) for x in (effects / "reference").read_text().split())
    assert runs == Counter(range(1, STEPS + 1))
    return {
        "count": STEPS,
        "log": [f"effect {n}" for n in range(1, STEPS + 1)],
        "thoughts": [f"thought at {n}" for n in range(STEPS)],
    }
