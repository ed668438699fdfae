"""Agent runner: the phase protocol, resume contract, failures, approvals, corruption, storage."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest
from agent_jobs import ScriptedLLM, lines, make_agent, summary
from proc import REPO

import afk_local as afk
from afk_local.agent.agent_runner import decision
from afk_local.agent.state import PHASE_KEYS, RUNTIME_STATE_KEYS
from afk_local.agent.types import Tool


@pytest.fixture
def store(tmp_path: Path) -> afk.Store:
    return afk.Store(tmp_path / "store")


@pytest.fixture
def out(tmp_path: Path) -> Path:
    path = tmp_path / "out"
    path.mkdir()
    return path


def phases(store: afk.Store, run_id: str) -> list[afk.Checkpoint]:
    return store.open(run_id).history()


STEP_WITH_TOOLS = [
    "step_started",
    "runtime_state",
    "pre_llm",
    "post_llm",
    "runtime_state",
    "pre_tool_batch",
    "post_tool_batch",
    "runtime_state",
]
FINAL_STEP = ["step_started", "runtime_state", "pre_llm", "post_llm", "runtime_state"]


def expected_phases(steps: int) -> list[str]:
    return ["run_started", *STEP_WITH_TOOLS * steps, *FINAL_STEP, "run_terminal"]


def test_phase_sequence_and_payload_keys(store: afk.Store, out: Path) -> None:
    """Must-show 1: 5 steps of 2 tools write the protocol's phases with the documented keys."""
    agent = make_agent(out, steps=5, per_step=2)
    result = afk.AgentRunner(store).run(agent, "go", run_id="seq")
    assert result.state == "completed"
    assert result.final_text is not None and result.final_text.startswith("final after 5 steps")
    history = phases(store, "seq")
    assert [c.phase for c in history] == expected_phases(5)
    assert [c.seq for c in history] == list(range(1, len(history) + 1))
    for record in history:
        if record.phase == "runtime_state":
            assert set(record.payload) == set(RUNTIME_STATE_KEYS)
        elif record.phase == "run_terminal":
            assert {"state", "final_text", "terminal_result"} <= set(record.payload)
            assert record.payload["state"] == "completed"
            assert record.payload["normalized_model"] == "scripted-1"
        else:
            assert set(record.payload) == set(PHASE_KEYS[record.phase]), record.phase
    # snapshots: pending response exactly at post_llm, steps counted, usage summed
    snaps = [c.payload for c in history if c.phase == "runtime_state"]
    assert [s["stage"] for s in snaps[:3]] == ["step_started", "post_llm", "post_tool_batch"]
    assert [s["pending_llm_response"] is not None for s in snaps[:3]] == [False, True, False]
    assert snaps[-1]["llm_calls"] == 6 and snaps[-1]["tool_calls"] == 10
    assert result.usage["completion_tokens"] == 18
    assert result.total_cost_usd == pytest.approx(0.006)
    assert result.llm_calls == 6 and len(result.tool_executions) == 10
    assert len(lines(out / "llm.log")) == 6 and len(lines(out / "effects.log")) == 10
    assert {c.step for c in history if c.phase == "pre_llm"} == {1, 2, 3, 4, 5, 6}
    # messages are plain chat dicts
    roles = [m["role"] for m in result.messages]
    assert roles[:3] == ["system", "user", "assistant"] and roles.count("tool") == 10
    tool_msg = result.messages[3]
    assert tool_msg["tool_call_id"] == "s1c0" and tool_msg["content"] == "page1.0"
    call = result.messages[2]["tool_calls"][1]
    assert call["type"] == "function" and json.loads(call["function"]["arguments"]) == {
        "step": 1,
        "i": 1,
    }


def test_completed_run_short_circuits(store: afk.Store, out: Path) -> None:
    agent = make_agent(out, steps=1)
    first = afk.AgentRunner(store).run(agent, "go", run_id="done")

    def exploding_llm(messages: Any, tools: Any) -> Any:
        raise AssertionError("a completed run must not call the model")

    again = afk.AgentRunner(store).resume(afk.Agent("tester", None, exploding_llm, {}), "done")
    assert summary(again) == summary(first)
    assert afk.AgentRunner(store).run(agent, "ignored", run_id="done").final_text == (
        first.final_text
    )
    assert len(lines(out / "llm.log")) == 2
    assert phases(store, "done")[-1].phase == "run_terminal"


def test_llm_failure_then_resume_retries(store: afk.Store, out: Path) -> None:
    """Must-show 5: the LLM raises at step 3; resume retries it; steps 1-2 are not repeated."""
    (out / "fail").touch()
    agent = make_agent(out, steps=4, fail_at=3)
    runner = afk.AgentRunner(store)
    failed = runner.run(agent, "go", run_id="flaky")
    assert failed.state == "failed" and "scripted outage at step 3" in (failed.error or "")
    assert store.read_meta("flaky").status is afk.RunStatus.FAILED
    terminal = phases(store, "flaky")[-1]
    assert terminal.phase == "run_terminal" and terminal.payload["state"] == "failed"
    assert lines(out / "llm.log") == ["step1", "step2", "step3"]
    (out / "fail").unlink()
    done = runner.resume(agent, "flaky")
    assert done.state == "completed"
    assert lines(out / "llm.log") == ["step1", "step2", "step3", "step3", "step4", "step5"]
    effects = lines(out / "effects.log")
    assert len(effects) == len(set(effects)) == 8
    (out / "ref").mkdir()
    reference = make_agent(out / "ref", steps=4)
    assert summary(done) == summary(afk.AgentRunner(store).run(reference, "go", run_id="ref"))


def test_tool_failure_fails_run_and_resume_reruns_only_the_failed_call(
    store: afk.Store, out: Path
) -> None:
    calls: list[str] = []
    broken = [True]

    def ok_tool(x: int) -> int:
        calls.append(f"ok{x}")
        return x

    def flaky_tool(x: int) -> int:
        calls.append(f"flaky{x}")
        if broken[0]:
            raise RuntimeError("disk full")
        return x

    def llm(messages: list[dict[str, Any]], tools: Any) -> afk.LLMResponse:
        if any(m["role"] == "tool" for m in messages):
            return afk.LLMResponse(text="ok")
        return afk.LLMResponse(
            tool_calls=[
                afk.ToolCall(id="a", name="ok_tool", arguments={"x": 1}),
                afk.ToolCall(id="b", name="flaky_tool", arguments={"x": 2}),
            ]
        )

    agent = afk.Agent(
        "t", None, llm, {"ok_tool": ok_tool, "flaky_tool": flaky_tool}, parallel_tools=False
    )
    runner = afk.AgentRunner(store)
    failed = runner.run(agent, "go", run_id="tf")
    assert failed.state == "failed" and "disk full" in (failed.error or "")
    broken[0] = False
    done = runner.resume(agent, "tf")
    assert done.state == "completed" and calls == ["ok1", "flaky2", "flaky2"]
    assert done.replayed_effect_count == 1


def test_tool_errors_report_goes_to_the_model(store: afk.Store) -> None:
    def boom() -> None:
        raise ValueError("nope")

    def llm(messages: list[dict[str, Any]], tools: Any) -> afk.LLMResponse:
        tool_msgs = [m for m in messages if m["role"] == "tool"]
        if tool_msgs:
            return afk.LLMResponse(text=tool_msgs[0]["content"])
        return afk.LLMResponse(tool_calls=[afk.ToolCall(id="x", name="boom")])

    agent = afk.Agent("t", None, llm, {"boom": boom}, tool_errors="report")
    result = afk.AgentRunner(store).run(agent, "go")
    assert result.state == "completed" and result.final_text == "Error: ValueError: nope"
    assert result.tool_executions[0]["status"] == "error"


def test_tool_batches_run_in_parallel(store: afk.Store) -> None:
    barrier = threading.Barrier(3, timeout=20)

    def meet(i: int) -> int:
        barrier.wait()  # only passes when all three calls run at once
        return i

    def llm(messages: list[dict[str, Any]], tools: Any) -> afk.LLMResponse:
        if any(m["role"] == "tool" for m in messages):
            return afk.LLMResponse(text="met")
        calls = [afk.ToolCall(id=f"m{i}", name="meet", arguments={"i": i}) for i in range(3)]
        return afk.LLMResponse(tool_calls=calls)

    result = afk.AgentRunner(store).run(afk.Agent("p", None, llm, {"meet": meet}), "go")
    assert result.state == "completed"
    assert [m["content"] for m in result.messages if m["role"] == "tool"] == ["0", "1", "2"]


def test_async_llm_and_tools(store: afk.Store) -> None:
    async def llm(messages: list[dict[str, Any]], tools: Any) -> afk.LLMResponse:
        await asyncio.sleep(0)
        if any(m["role"] == "tool" for m in messages):
            return afk.LLMResponse(text=messages[-1]["content"])
        return afk.LLMResponse(tool_calls=[afk.ToolCall(id="a", name="double", arguments={"x": 4})])

    async def double(x: int) -> int:
        """Double x."""
        await asyncio.sleep(0)
        return 2 * x

    agent = afk.Agent("a", None, llm, {"double": double})
    assert afk.AgentRunner(store).run(agent, "go").final_text == "8"
    spec = agent.tool_specs()[0]
    assert spec == {
        "name": "double",
        "description": "Double x.",
        "parameters": {
            "type": "object",
            "properties": {"x": {"type": "integer"}},
            "required": ["x"],
        },
    }


def test_approval_pause_approve_and_deny(store: afk.Store, out: Path) -> None:
    """Must-show 6 (in one process; test_agent_crash does it across processes)."""
    agent = make_agent(out, steps=1, per_step=2, approval=True)
    runner = afk.AgentRunner(store)
    paused = runner.run(agent, "go", run_id="ap")
    assert paused.state == "paused"
    assert paused.pending is not None and paused.pending["kind"] == "approval"
    assert paused.pending["prompt"]["tool_call"]["name"] == "publish"
    last = phases(store, "ap")[-1]
    assert last.phase == "paused" and last.payload["kind"] == "approval"
    assert store.read_meta("ap").status is afk.RunStatus.PAUSED
    assert lines(out / "effects.log") == []  # nothing of the batch ran before the decision
    assert runner.resume(agent, "ap").state == "paused"  # no input: still waiting
    done = runner.resume(agent, "ap", input=True)
    assert done.state == "completed"
    assert sorted(lines(out / "effects.log")) == ["fetch s1c0", "publish s1c1"]
    names = [c.phase for c in phases(store, "ap")]
    assert names[names.index("paused") + 1 : names.index("paused") + 3] == [
        "run_started",
        "resumed",
    ]
    assert lines(out / "llm.log") == ["step1", "step2"]

    out2 = out / "deny"
    out2.mkdir()
    agent2 = make_agent(out2, steps=1, per_step=2, approval=True)
    assert runner.run(agent2, "go", run_id="deny").state == "paused"
    denied = runner.resume(agent2, "deny", input={"decision": "deny", "reason": "too risky"})
    assert denied.state == "completed"
    assert lines(out2 / "effects.log") == ["fetch s1c0"]
    statuses = {e["name"]: e["status"] for e in denied.tool_executions}
    assert statuses == {"fetch": "ok", "publish": "denied"}
    assert "Denied by a person: too risky" in (denied.final_text or "")
    assert runner.resume(agent2, "deny", input=True).state == "completed"  # stored result


def test_decision_values() -> None:
    assert decision(True) == (True, None)
    assert decision(False) == (False, None)
    assert decision({"decision": "approve"}) == (True, None)
    assert decision({"decision": "deny", "reason": "r"}) == (False, "r")
    assert decision("yes") == (True, None)


def _corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    os.chmod(path, 0o600)
    path.write_bytes(bytes(data))


def test_corrupt_latest_snapshot_raises_or_falls_back(store: afk.Store, out: Path) -> None:
    agent = make_agent(out, steps=3)
    runner = afk.AgentRunner(store)
    runner.run(agent, "go", run_id="cor")
    reference = runner.resume(agent, "cor")
    # make it look interrupted after step 2's tools: drop everything after that snapshot
    run_dir = store.paths("cor").dir
    files = sorted(run_dir.glob("*.ckpt"))
    cut = [f for f in files if f.name.endswith("runtime_state.ckpt")][5]  # step 2 post_tool_batch
    for f in files:
        if f.name > cut.name:
            f.unlink()
    (run_dir / "latest").unlink()
    with store.resume_writer("cor") as w:  # status back to running, as after a crash
        w.update_meta(status=afk.RunStatus.RUNNING)
    _corrupt(cut)
    with pytest.raises(afk.CheckpointCorruptionError, match=cut.name):
        runner.resume(agent, "cor")
    before = len(lines(out / "llm.log"))
    effects_before = len(lines(out / "effects.log"))
    result = runner.resume(agent, "cor", on_corrupt="fallback")
    assert summary(result) == summary(reference)
    # fell back to step 2's post_llm snapshot: its tools and the later LLM answers and
    # tools (journaled by the first, complete run) were all replayed, none called again
    assert len(lines(out / "effects.log")) == effects_before
    assert len(lines(out / "llm.log")) == before
    assert result.replayed_effect_count >= 2 + 1 + 2 + 1


def test_max_steps_fails(store: afk.Store, out: Path) -> None:
    agent = make_agent(out, steps=10)
    agent.max_steps = 2
    result = afk.AgentRunner(store).run(agent, "go", run_id="ms")
    assert result.state == "failed" and "max_steps=2" in (result.error or "")


def test_subagent_is_a_child_run(store: afk.Store, out: Path) -> None:
    agent = make_agent(out, steps=2, subagent=True)
    result = afk.AgentRunner(store).run(agent, "go", run_id="par")
    assert result.state == "completed"
    child = "par.s1.s1c0"
    meta = store.read_meta(child)
    assert meta.parent_run_id == "par" and meta.status is afk.RunStatus.COMPLETED
    names = [c.phase for c in phases(store, "par")]
    assert names[6:10] == [
        "pre_subagent_batch",
        "post_subagent_batch",
        "pre_tool_batch",
        "post_tool_batch",
    ]
    sub = next(c for c in phases(store, "par") if c.phase == "post_subagent_batch")
    assert sub.payload == {"success_count": 1, "failure_count": 0}
    pre = next(c for c in phases(store, "par") if c.phase == "pre_subagent_batch")
    assert pre.payload == {"targets": ["researcher"], "router_parallel": True}
    assert result.tool_executions[0]["kind"] == "subagent"
    assert result.tool_executions[0]["child_run_id"] == child
    assert "subpage1.0" in (result.final_text or "")


def test_tool_wrapper_and_specs() -> None:
    @afk.agent.tool(requires_approval=True, idempotent=True)
    def send(to: str, body: str = "") -> str:
        """Send a message."""
        return to

    assert isinstance(send, Tool) and send.requires_approval and send.idempotent
    assert send.spec()["parameters"]["required"] == ["to"]
    with pytest.raises(TypeError):
        afk.Agent("x", None, ScriptedLLM(Path("."), 1), {"bad": 3}).tool_table()


def test_storage_growth_200_steps(tmp_path: Path) -> None:
    """Must-show 8: bytes on disk of a 200-step run vs full JSON snapshots at every phase.

    This counts bytes, not fsyncs: it runs on tmpfs where there is one (1,200 sync
    checkpoints on a loaded disk took most of a CI minute's share)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from bench_agent import measure  # noqa: PLC0415 - benchmarks/ is not a package

    shm = Path("/dev/shm")
    with tempfile.TemporaryDirectory(
        dir=shm if shm.is_dir() and os.access(shm, os.W_OK) else tmp_path
    ) as where:
        row = measure(Path(where), steps=200)
    print(
        f"\n200-step agent run: {row['checkpoints']} checkpoints, {row['disk_bytes']:,} B on disk "
        f"(checkpoints {row['ckpt_bytes']:,} B + journal {row['journal_bytes']:,} B) vs "
        f"{row['json_bytes']:,} B as a full JSON snapshot per phase "
        f"({row['ratio']:.2%}); JSON of runtime_state rows only: {row['json_rs_bytes']:,} B"
    )
    assert row["disk_bytes"] < row["json_bytes"] / 5


@pytest.mark.parametrize("durability", ["async", "exit"])
def test_durability_modes_give_the_same_result(tmp_path: Path, durability: str) -> None:
    results = []
    for mode in ("sync", durability):
        out = tmp_path / mode
        out.mkdir()
        runner = afk.AgentRunner(tmp_path / f"store-{mode}", durability=mode)
        results.append(summary(runner.run(make_agent(out, steps=3), "go", run_id="d")))
    assert results[0] == results[1]
    reader = afk.Store(tmp_path / f"store-{durability}").open("d")
    assert reader.meta.status is afk.RunStatus.COMPLETED
    assert reader.history()[-1].phase == "run_terminal"
