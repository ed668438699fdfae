"""A tool that takes an ``idempotency_key``, SIGKILLed mid-call, is called again with the
same key on resume, without a settle (issue 28: the rule of ``ctx.step``, now the
agent's default too); ``idempotent=False`` keeps such a call in doubt."""

from __future__ import annotations

import signal
from pathlib import Path

import proc

CHILD = """
import os, sys, time
import afk_local as afk
from afk_local.agent.types import LLMResponse, ToolCall, Tool

root, service, mode, step_s = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])

def charge(amount: int, *, idempotency_key: str) -> str:
    '''Charge the customer.'''
    with open(service, "a") as fh:  # the service logs every call it receives
        fh.write(f"{amount} {idempotency_key}\\n")
    print("charging", flush=True)
    time.sleep(step_s)
    return f"charged {amount}"

def llm(messages, tools):
    if not any(m.get("role") == "tool" for m in messages):
        call = ToolCall(id="call_1", name="charge", arguments={"amount": 5})
        return LLMResponse(text=None, tool_calls=[call], provider="scripted")
    return LLMResponse(text="done: " + messages[-1]["content"], provider="scripted")

tool = Tool(charge, name="charge", idempotent=False) if mode == "never" else charge
agent = afk.Agent("payer", "Pay.", llm, tools={"charge": tool})
runner = afk.AgentRunner(afk.Store(root))
store = afk.Store(root)
result = runner.resume(agent, "a") if store.exists("a") else runner.run(agent, "pay", run_id="a")
print("result", result.final_text, flush=True)
"""


def _kill_in_the_tool(root: Path, service: Path, mode: str) -> None:
    child = proc.spawn(CHILD, str(root), str(service), mode, "30")
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "charging", child.stderr
    child.kill()
    child.communicate(timeout=30)
    assert child.returncode == -signal.SIGKILL


def test_a_keyed_tool_killed_mid_call_is_retried_with_the_same_key(tmp_path: Path) -> None:
    root, service = tmp_path / "store", tmp_path / "service.log"
    _kill_in_the_tool(root, service, "default")
    done = proc.run(CHILD, str(root), str(service), "default", "0")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("result done: charged 5")
    calls = service.read_text().splitlines()
    assert len(calls) == 2 and calls[0] == calls[1]  # called again, with the same key


def test_idempotent_false_keeps_a_keyed_tool_in_doubt(tmp_path: Path) -> None:
    root, service = tmp_path / "store", tmp_path / "service.log"
    _kill_in_the_tool(root, service, "never")
    again = proc.run(CHILD, str(root), str(service), "never", "0")
    assert again.returncode != 0
    assert "EffectInDoubtError" in again.stderr, again.stderr
    assert len(service.read_text().splitlines()) == 1  # not called again
