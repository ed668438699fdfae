"""Agent runs resumed by another process: `afk-local resume` and the watcher, with real SIGKILLs.

Agents live in ``tests/agent_watcher_jobs.py`` (a module-level ``researcher``
and a ``build(context)`` factory), on PYTHONPATH for every child. Outside side
effects are lines in ``effects.log`` (tools) and ``llm.log`` (one per real LLM
call), so "exactly once" is checked by counting lines.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import proc
import pytest
from agent_jobs import lines, make_agent
from agent_watcher_jobs import CHILD, build
from proc import REPO, SUPPORT

import afk_local as afk_api
from afk_local.agent.rebuild import load_agent
from afk_local.errors import EntrypointError
from afk_local.storage.format.records import RunStatus
from afk_local.storage.store import Store

TESTS = SUPPORT
EXAMPLES = REPO / "examples"
PYTHONPATH = os.pathsep.join(
    p for p in (str(TESTS), str(REPO), os.environ.get("PYTHONPATH", "")) if p
)
FAST = ["--interval", "0.2", "--backoff", "0.2", "--grace", "10"]


def env(out: Path | None = None, path: Path | None = None) -> dict[str, str]:
    pythonpath = PYTHONPATH if path is None else os.pathsep.join((str(path), PYTHONPATH))
    values = {**os.environ, "PYTHONPATH": pythonpath}
    if out is not None:
        values["AFK_TEST_AGENT_OUT"] = str(out)
    return values


def start(root: Path, run_id: str, agent: str, out: Path, **job: Any) -> subprocess.Popen[str]:
    spec = {"root": str(root), "run_id": run_id, "agent": agent, **job}
    return proc.spawn(CHILD, json.dumps(spec), env={"AFK_TEST_AGENT_OUT": str(out)})


def interrupt(root: Path, run_id: str, agent: str, out: Path, kill: dict[str, Any], **job: Any):
    """Run an agent in a child that SIGKILLs itself at ``kill``: an interrupted run."""
    killed = proc.kill_after(start(root, run_id, agent, out, kill=kill, **job), seconds=60)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert Store(root).read_meta(run_id).status is RunStatus.RUNNING


def afk(
    root: Path, *args: str, out: Path | None = None, path: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``afk-local ARGS --root ROOT`` (``path`` prepended to PYTHONPATH)."""
    cmd = [sys.executable, "-m", "afk_local", *args, "--root", str(root)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env(out, path), timeout=60)


def watch_once(
    root: Path, *flags: str, out: Path | None = None, path: Path | None = None
) -> tuple[int, list[dict]]:
    res = afk(root, "watch", "--once", "--json", *FAST, *flags, out=out, path=path)
    assert "Traceback" not in res.stderr, res.stderr
    return res.returncode, [json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]


def of(events: list[dict], kind: str, run_id: str | None = None) -> list[dict]:
    return [e for e in events if e["event"] == kind and (run_id is None or e["run_id"] == run_id)]


def once_each(out: Path, steps: int, per_step: int = 2) -> None:
    """Every tool call of every step happened exactly once; the LLM was called once per step."""
    effects = Counter(lines(out / "effects.log"))
    names = ["fetch" if i % 2 == 0 else "note" for i in range(per_step)]
    expected = {f"{names[i]} s{n}c{i}" for n in range(1, steps + 1) for i in range(per_step)}
    assert set(effects) == expected, effects
    assert all(count == 1 for count in effects.values()), effects
    assert lines(out / "llm.log") == [f"step{n}" for n in range(1, steps + 2)]


# -- 1. SIGKILL mid-run, `watch --once` finishes it ------------------------------------------


def test_killed_agent_run_is_resumed_to_completion_by_watch_once(tmp_path: Path) -> None:
    root, out = tmp_path / "store", tmp_path / "out"
    out.mkdir()
    # killed between the two tools of step 2: fetch done and journaled, note not started
    interrupt(root, "r1", "researcher", out, {"after_outcome": "step2/tool/s2c0"})
    store = Store(root)
    meta = store.read_meta("r1")
    assert meta.entrypoint == "agent_watcher_jobs:researcher"
    assert meta.extra["kind"] == "agent"
    assert meta.extra["runner"]["durability"] == "sync"
    assert lines(out / "effects.log") == ["fetch s1c0", "note s1c1", "fetch s2c0"]

    code, events = watch_once(root, out=out)

    assert code == 0, events
    assert [e["run_id"] for e in of(events, "resumed")] == ["r1"]
    assert [e["run_id"] for e in of(events, "completed")] == ["r1"]
    assert store.read_meta("r1").status is RunStatus.COMPLETED
    result = store.open("r1").resume_state().result
    assert result["state"] == "completed"
    assert result["final_text"].startswith("final after 3 steps")
    assert result["replayed_effect_count"] >= 1  # fetch s2c0 came from the journal
    once_each(out, steps=3)
    code, events = watch_once(root, out=out)  # nothing left to do
    assert code == 0 and not of(events, "resumed")


# -- 2. `afk-local resume RUN` continues an interrupted agent run (factory + context) ----------


def test_afk_local_resume_continues_an_interrupted_agent_run(tmp_path: Path) -> None:
    root, out = tmp_path / "store", tmp_path / "out"
    out.mkdir()
    context = {"out": str(out), "steps": 3}
    # killed right after the model's step-2 answer was journaled, before post_llm:
    # the resume must take the answer from the journal, not ask the model again
    interrupt(root, "r2", "build", out, {"after_outcome": "step2/llm"}, context=context)
    meta = Store(root).read_meta("r2")
    assert meta.entrypoint == "agent_watcher_jobs:build"
    assert lines(out / "llm.log") == ["step1", "step2"]

    res = afk(root, "resume", "r2")

    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith('run r2 completed: "final after 3 steps'), res.stdout
    assert Store(root).read_meta("r2").status is RunStatus.COMPLETED
    once_each(out, steps=3)
    again = afk(root, "resume", "r2", "--json")  # completed: its result, nothing runs
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == {
        "run_id": "r2",
        "status": "completed",
        "result": json.loads(res.stdout.split(": ", 1)[1]),
    }


# -- 3. an approval pause: not auto-resumed; `resume --input true` continues it ---------------


def test_paused_agent_run_waits_for_a_person_then_resumes_with_input(tmp_path: Path) -> None:
    root, out = tmp_path / "store", tmp_path / "out"
    out.mkdir()
    context = {"out": str(out), "steps": 1, "approval": True}
    done = proc.kill_after(start(root, "r3", "build", out, context=context), seconds=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.lines[-1])["state"] == "paused"
    store = Store(root)
    assert store.read_meta("r3").status is RunStatus.PAUSED

    code, events = watch_once(root, out=out)
    assert code == 0 and not of(events, "resumed"), events
    assert store.read_meta("r3").status is RunStatus.PAUSED
    asked = afk(root, "resume", "r3")  # no input: says what it waits for, changes nothing
    assert asked.returncode == 0, asked.stderr
    assert "paused waiting for approval" in asked.stdout
    assert "--input" in asked.stdout
    assert lines(out / "effects.log") == []

    res = afk(root, "resume", "r3", "--input", "true")

    assert res.returncode == 0, res.stderr
    assert 'completed: "final after 1 steps: page1.0 | published 1"' in res.stdout, res.stdout
    assert store.read_meta("r3").status is RunStatus.COMPLETED
    assert sorted(lines(out / "effects.log")) == ["fetch s1c0", "publish s1c1"]
    assert lines(out / "llm.log") == ["step1", "step2"]


# -- 4. an agent defined in __main__: resume says why and what to do; the watcher gives up -----

MAIN_AGENT = """
import os, signal, sys
import afk_local as afk

def llm(messages, tools):
    n = sum(m["role"] == "assistant" for m in messages) + 1
    if n == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return afk.LLMResponse(tool_calls=[afk.ToolCall(id=f"c{n}", name="noop")])

def noop() -> str:
    \"\"\"Do nothing.\"\"\"
    return "ok"

agent = afk.Agent("scripted", None, llm, {"noop": noop})
afk.AgentRunner(sys.argv[1]).run(agent, "go", run_id="main-run")
"""

STATE_LOOP = """
import os, sys
import afk_local as afk
afk.StateCheckpoint(sys.argv[1]).save({"epoch": 3})
os._exit(0)  # a loop that died: its run stays `running` with a free lock
"""


def test_main_agent_cannot_be_resumed_elsewhere_and_runs_without_entrypoint_are_left_alone(
    tmp_path: Path,
) -> None:
    root = tmp_path / "store"
    store = Store(root)
    killed = proc.kill_after(proc.spawn(MAIN_AGENT, str(root)), seconds=60)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert store.read_meta("main-run").entrypoint == "__main__:agent"

    res = afk(root, "resume", "main-run")

    assert res.returncode == 2, (res.stdout, res.stderr)
    assert res.stderr == (
        "afk-local: run 'main-run' cannot be resumed: its agent was defined in a script run "
        "as __main__, which no other process can rebuild: run the script again with the same "
        "run id, or move the agent (or a function returning it) into an importable module\n"
    )
    assert store.read_meta("main-run").status is RunStatus.RUNNING  # untouched

    # runs with no entrypoint: a StateCheckpoint loop and what a LangGraph thread leaves
    assert proc.run(STATE_LOOP, str(root)).returncode == 0
    with store.create("lg-thread", thread_id="t1", extra={"integration": "langgraph"}) as run:
        run.checkpoint("langgraph", {"v": 1}, step=0)
    before = {rid: store.paths(rid).meta.read_bytes() for rid in ("state", "lg-thread")}

    before["main-run"] = store.paths("main-run").meta.read_bytes()

    code, events = watch_once(root, "--max-attempts", "1")

    # knowable up front: no doomed attempt, never marked failed, said once
    assert code == 0, events
    assert not of(events, "resumed") and not of(events, "gave_up")
    assert [e["run_id"] for e in of(events, "skipped")] == ["main-run"]
    assert (
        "cannot be resumed: its agent was defined in a script"
        in of(events, "skipped")[0]["message"]
    )
    for rid, data in before.items():  # never resumed, never marked failed
        assert store.paths(rid).meta.read_bytes() == data
        assert not (store.paths(rid).dir / "logs").exists()
    assert store.read_meta("state").status is RunStatus.RUNNING


# -- 5. SIGTERM to a watcher supervising agent runs: they stop cleanly, a new watcher finishes --


def Serving(root: Path, out: Path) -> proc.JsonLinesChild:
    """``afk-local watch --json`` in the background, its events collected."""
    cmd = [sys.executable, "-m", "afk_local", "watch", "--root", str(root), "--json", *FAST]
    return proc.JsonLinesChild(cmd, env(out))


def test_sigterm_stops_agent_children_cleanly_and_the_next_watcher_finishes(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = Store(root)
    outs = {"term-seq": tmp_path / "seq", "term-par": tmp_path / "par"}
    for rid, out in outs.items():
        out.mkdir()
        # non-idempotent tools that spend their time *inside* the call: a SIGTERM must
        # let the call finish and be journaled, or the next resume finds it in doubt
        context = {"out": str(out), "steps": 4, "delay": 0.3, "parallel": rid == "term-par"}
        interrupt(root, rid, "build", out, {"after_phase": ["run_started", None]}, context=context)
    with Serving(root, tmp_path) as watcher:
        watcher.wait_for(lambda: len(of(watcher.events, "resumed")) == 2)

        def in_a_tool(out: Path) -> bool:  # resumed work done, and a tool call in flight now
            done = len(lines(out / "effects.log"))
            return done >= 2 and len(lines(out / "begun.log")) > done

        watcher.wait_for(lambda: all(in_a_tool(out) for out in outs.values()))
        assert watcher.stop() == 0
    stopped = of(watcher.events, "stopped")
    assert sorted(e["run_id"] for e in stopped) == sorted(outs)
    assert all(e["exit_code"] != -signal.SIGKILL for e in stopped), stopped
    assert not of(watcher.events, "failed") and not of(watcher.events, "backoff")
    for rid in outs:
        meta = store.read_meta(rid)
        assert meta.status is RunStatus.RUNNING, meta  # stopped, not failed
        assert meta.watcher_attempts == 0 and meta.next_attempt_ms == 0
        effects = store.open(rid).effects()
        intents = {e.key for e in effects if e.kind == "intent"}
        outcomes = {e.key for e in effects if e.kind == "outcome"}
        assert intents <= outcomes, intents - outcomes  # nothing left in doubt

    code, events = watch_once(root)

    assert code == 0, events
    for rid, out in outs.items():
        assert store.read_meta(rid).status is RunStatus.COMPLETED
        once_each(out, steps=4)


# -- 6. the README story: kill -9 the example agent, the watcher finishes it -----------------


def test_example_agent_killed_with_sigkill_is_finished_by_the_watcher(tmp_path: Path) -> None:
    root, notes = tmp_path / "store", tmp_path / "notes.txt"
    args = ["--topics", "4", "--delay", "0.05", "--notes", str(notes)]
    boot = (
        f"import runpy, sys; sys.argv = ['agent_resume.py'] + sys.argv[1:]; "
        f"runpy.run_path({str(EXAMPLES / 'agent_resume.py')!r}, run_name='__main__')"
    )
    child = proc.spawn(boot, *args, env={"AFK_LOCAL_ROOT": str(root)})
    killed = proc.kill_after(child, acks=5)  # mid-run: after the 5th tool line
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert Store(root).read_meta("agent-demo").entrypoint == "agent_resume:build_agent"

    # the watcher's children rebuild the agent from agent_resume:build_agent
    code, events = watch_once(root, path=EXAMPLES)

    assert code == 0, events
    assert [e["run_id"] for e in of(events, "completed")] == ["agent-demo"]
    result = Store(root).open("agent-demo").resume_state().result
    assert result["final_text"] == "Researched 4 topics; 4 notes saved."
    written = notes.read_text().splitlines()
    assert len(written) == 4 and len(set(written)) == 4, written


# -- 7. in-process: afk.resume of an agent run; older runs get an entrypoint on resume ---------


def test_afk_resume_rebuilds_the_agent_and_a_run_without_entrypoint_gets_one(
    tmp_path: Path,
) -> None:
    root, out = tmp_path / "store", tmp_path / "out"
    out.mkdir()
    store = Store(root)
    runner = afk_api.AgentRunner(store)
    # built inside a function, no entrypoint: recorded as an agent run nobody can rebuild
    local = make_agent(out, steps=1, approval=True)
    paused = runner.run(local, "go", run_id="old")
    assert paused.state == "paused"
    meta = store.read_meta("old")
    assert meta.entrypoint is None and meta.extra["kind"] == "agent"
    with pytest.raises(EntrypointError, match=r"runner\.resume\(agent, run_id\).*module level"):
        load_agent(meta)
    assert afk_api.resume("old", store=store).state == "paused"  # no input: nothing imported

    # resumed once with a rebuildable agent: the run records its entrypoint from now on
    rebuilt = build({"out": str(out), "steps": 1, "approval": True})
    done = runner.resume(rebuilt, "old", input=True)
    assert done.state == "completed"
    assert store.read_meta("old").entrypoint == "agent_watcher_jobs:build"

    # afk.resume of an agent run returns its AgentResult (completed: nothing runs)
    again = afk_api.resume("old", store=store)
    assert isinstance(again, afk_api.AgentResult) and again.final_text == done.final_text
    assert sorted(lines(out / "effects.log")) == ["fetch s1c0", "publish s1c1"]
