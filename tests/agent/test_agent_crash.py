"""Agent runner crash tests: real child processes SIGKILLed at precise points, then resumed.

A child (``agent_jobs.child_main``) kills itself with SIGKILL right after a
chosen checkpoint file was durably published (or right after a chosen journal
outcome), so no ``finally``, atexit or flush runs: the crash is as real as an
OOM kill. A fresh process resumes. The scripted LLM and tools append a line
per real call to outside files, so "exactly once" is a line count.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import proc
import pytest
from agent_jobs import CHILD, lines, make_agent, summary
from proc import REPO
from test_agent import expected_phases

import afk_local as afk


def child(job: dict[str, Any]) -> subprocess.Popen[str]:
    return proc.spawn(CHILD, json.dumps(job))


def finish(p: subprocess.Popen[str], timeout: float = 120) -> tuple[int, list[dict[str, Any]]]:
    out, err = p.communicate(timeout=timeout)
    results = json.loads(out.splitlines()[-1]) if out.strip() else []
    if p.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(f"child failed ({p.returncode}):\n{err}")
    return p.returncode, results


def reference(tmp: Path, **agent: Any) -> afk.AgentResult:
    out = tmp / "ref-out"
    out.mkdir()
    return afk.AgentRunner(tmp / "ref-store").run(make_agent(out, **agent), "research afk_local")


def run_killed(jobs: list[dict[str, Any]], batch: int = 4) -> None:
    """Start the kill children ``batch`` at a time; each must die by SIGKILL."""
    for start in range(0, len(jobs), batch):
        started = [child(job) for job in jobs[start : start + batch]]
        for p in started:
            code, _ = finish(p)
            assert code == -signal.SIGKILL, "the child finished before its kill point"


def test_kill_at_every_phase_boundary_then_resume(tmp_path: Path, trials: Any) -> None:
    """Must-show 2: SIGKILL after each checkpoint of a run in turn; resume in a new process."""
    steps = trials(3, 6)
    agent = {"steps": steps, "per_step": 2}
    ref = reference(tmp_path, **agent)
    ref_effects = sorted(lines(tmp_path / "ref-out" / "effects.log"))
    sequence = expected_phases(steps)
    root = str(tmp_path / "store")
    runs = []
    for k in range(1, len(sequence) + 1):
        out = tmp_path / f"out{k}"
        out.mkdir()
        runs.append([f"k{k}", str(out)])
    run_killed(
        [
            {
                "action": "run",
                "root": root,
                "runs": [run],
                "agent": agent,
                "kill": {"after_checkpoints": k},
            }
            for k, run in enumerate(runs, start=1)
        ]
    )
    store = afk.Store(root)
    for k, (run_id, _) in enumerate(runs, start=1):
        history = store.open(run_id).history()
        assert [c.phase for c in history] == sequence[:k], run_id  # killed right after ckpt k
    code, results = finish(child({"action": "resume", "root": root, "runs": runs, "agent": agent}))
    assert code == 0
    for k, ((run_id, out), result) in enumerate(zip(runs, results, strict=True), start=1):
        phase = sequence[k - 1]
        replayed = result.pop("replayed")
        assert result == summary(ref), f"kill after {phase} (checkpoint {k})"
        # the LLM answered each step once: never again for a step whose answer was kept
        assert lines(Path(out) / "llm.log") == [f"step{n}" for n in range(1, steps + 2)], phase
        effects = lines(Path(out) / "effects.log")
        assert sorted(effects) == ref_effects, f"kill after {phase}: {Counter(effects)}"
        # replays: the LLM answer after post_llm (its snapshot was not written yet),
        # both tools after post_tool_batch; nothing was in flight at the other boundaries
        assert replayed == {"post_llm": 1, "post_tool_batch": 2}.get(phase, 0), phase
        assert store.read_meta(run_id).status is afk.RunStatus.COMPLETED


@pytest.mark.parametrize("durability", ["sync", "async"])
def test_kill_between_two_tools_of_a_batch(tmp_path: Path, durability: str) -> None:
    """Must-show 3: the first tool finished before the kill is replayed, not re-run.

    With ``async`` checkpoints the newest snapshot may lag behind, but the journal
    is synchronous, so nothing runs twice either way.
    """
    agent = {"steps": 2, "per_step": 2, "parallel": False}
    root = str(tmp_path / "store")
    out = tmp_path / "out"
    out.mkdir()
    run = ["between", str(out)]
    run_killed(
        [
            {
                "action": "run",
                "root": root,
                "runs": [run],
                "agent": agent,
                "kill": {"after_outcome": "step1/tool/s1c0"},
                "durability": durability,
            }
        ]
    )
    assert lines(out / "effects.log") == ["fetch s1c0"]
    job = {"action": "resume", "root": root, "runs": [run], "agent": agent}
    code, results = finish(child({**job, "durability": durability}))
    assert code == 0
    assert results[0]["state"] == "completed"
    # sync: resumed from step 1's post_llm snapshot, only the tool is replayed; async: an
    # older snapshot may be the newest on disk, then the LLM answer is replayed as well
    assert results[0]["replayed"] == 1 if durability == "sync" else results[0]["replayed"] >= 1
    assert lines(out / "effects.log") == ["fetch s1c0", "note s1c1", "fetch s2c0", "note s2c1"]
    assert lines(out / "llm.log") == ["step1", "step2", "step3"]
    assert results[0]["final_text"] == reference(tmp_path, **agent).final_text


def test_kill_right_after_a_resumes_run_started(tmp_path: Path) -> None:
    """Must-show 4: crash again just after a resume's run_started; resume from the newest one."""
    agent = {"steps": 3, "per_step": 2}
    root = str(tmp_path / "store")
    out = tmp_path / "out"
    out.mkdir()
    run = ["twice", str(out)]
    base = {"root": root, "runs": [run], "agent": agent}
    # first crash: right after step 2's post_tool_batch snapshot
    first = expected_phases(3).index("runtime_state", 1 + 8 + 7) + 1
    run_killed([{**base, "action": "run", "kill": {"after_checkpoints": first}}])
    # second crash: the resume dies right after writing its run_started
    run_killed([{**base, "action": "resume", "kill": {"after_checkpoints": 1}}])
    store = afk.Store(root)
    latest = store.open("twice").latest()
    assert latest is not None and latest.phase == "run_started"
    assert latest.payload == {"agent_name": "tester", "resumed": True}
    effects_before = lines(out / "effects.log")
    assert len(effects_before) == 4
    code, results = finish(child({**base, "action": "resume"}))
    assert code == 0 and results[0]["state"] == "completed"
    assert lines(out / "llm.log") == ["step1", "step2", "step3", "step4"]
    reference(tmp_path, **agent)
    assert sorted(lines(out / "effects.log")) == sorted(lines(tmp_path / "ref-out" / "effects.log"))
    phases = [c.phase for c in store.open("twice").history()]
    # the successful resume went on with step 3 (from the step-2 snapshot), not step 1
    third = len(phases) - 1 - phases[::-1].index("run_started")
    assert phases[third + 1] == "step_started"
    assert store.open("twice").get(third + 2).step == 3


def test_approval_across_processes(tmp_path: Path) -> None:
    """Must-show 6: pause in one process; approve (and deny) from another."""
    agent = {"steps": 1, "per_step": 2, "approval": True}
    root = str(tmp_path / "store")
    runs = []
    for name in ("approve", "deny"):
        out = tmp_path / name
        out.mkdir()
        runs.append([name, str(out)])
    code, paused = finish(child({"action": "run", "root": root, "runs": runs, "agent": agent}))
    assert code == 0 and [r["state"] for r in paused] == ["paused", "paused"]
    store = afk.Store(root)
    for run_id, out in runs:
        assert store.read_meta(run_id).status is afk.RunStatus.PAUSED
        assert lines(Path(out) / "effects.log") == []
    for (run_id, out), answer in zip(runs, [True, {"decision": "deny"}], strict=True):
        code, results = finish(
            child(
                {
                    "action": "resume",
                    "root": root,
                    "runs": [[run_id, out]],
                    "agent": agent,
                    "input": answer,
                }
            )
        )
        assert code == 0 and results[0]["state"] == "completed"
        phases = [c.phase for c in store.open(run_id).history()]
        assert phases[phases.index("paused") + 1 : phases.index("paused") + 3] == [
            "run_started",
            "resumed",
        ]
        assert lines(Path(out) / "llm.log") == ["step1", "step2"]
    assert sorted(lines(tmp_path / "approve" / "effects.log")) == ["fetch s1c0", "publish s1c1"]
    assert lines(tmp_path / "deny" / "effects.log") == ["fetch s1c0"]


@pytest.mark.parametrize(
    "kill",
    [
        {"after_phase": ["run_terminal", "sub.s1.s1c0"]},  # child done, parent not told yet
        {"after_phase": ["post_subagent_batch", "sub"]},
    ],
    ids=["after-child-terminal", "after-post-subagent-batch"],
)
def test_finished_subagent_is_not_rerun(tmp_path: Path, kill: dict[str, Any]) -> None:
    """Must-show 7: a subagent that finished before the crash is replayed, not re-run."""
    agent = {"steps": 2, "per_step": 2, "subagent": True}
    root = str(tmp_path / "store")
    out = tmp_path / "out"
    out.mkdir()
    base = {"root": root, "runs": [["sub", str(out)]], "agent": agent}
    run_killed([{**base, "action": "run", "kill": kill}])
    assert lines(out / "sub_llm.log") == ["step1", "step2"]
    assert lines(out / "sub_effects.log") == ["subfetch s1c0"]
    code, results = finish(child({**base, "action": "resume"}))
    assert code == 0 and results[0]["state"] == "completed"
    assert lines(out / "sub_llm.log") == ["step1", "step2"]
    assert lines(out / "sub_effects.log") == ["subfetch s1c0"]
    assert "subpage1.0" in results[0]["final_text"]
    store = afk.Store(root)
    assert store.read_meta("sub.s1.s1c0").status is afk.RunStatus.COMPLETED
    assert store.read_meta("sub.s1.s1c0").parent_run_id == "sub"
    assert results[0]["final_text"] == reference(tmp_path, **agent).final_text


def test_example_agent_resume_killed_and_resumed(tmp_path: Path) -> None:
    """examples/agent_resume.py: SIGKILLed mid-run, run again, every note saved exactly once."""
    script = REPO / "examples" / "agent_resume.py"
    notes = tmp_path / "notes.txt"
    args = ["--topics", "5", "--delay", "0.01", "--notes", str(notes)]
    boot = (
        f"import runpy, sys; sys.argv = [{str(script)!r}] + sys.argv[1:]; "
        f"runpy.run_path({str(script)!r}, run_name='__main__')"
    )
    env = {"AFK_LOCAL_ROOT": str(tmp_path / "store")}
    killed = proc.kill_after(proc.spawn(boot, *args, env=env), acks=7)
    assert killed.returncode == -signal.SIGKILL and len(killed.lines) >= 7
    done = proc.run(boot, *args, env=env)
    assert done.returncode == 0, done.stderr
    assert "completed: Researched 5 topics; 5 notes saved." in done.stdout
    assert len(notes.read_text().splitlines()) == 5
    assert len(set(notes.read_text().splitlines())) == 5
    # the resumed process did not start over: the first topic's tools were not called again
    assert "tool search write-ahead logs" not in done.stdout
