"""An agent run whose agent is gone (its module renamed) is marked unresumable by
``afk-local resume``, as a ``@durable`` job's run is (issue 28): ``runs --json`` says
why, so the watcher leaves it alone; once the agent is back, a resume completes the
run and clears the mark."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import proc
from proc import REPO

import afk_local as afk

MODULE = """
import os, time
import afk_local as afk
from afk_local.agent.types import LLMResponse, ToolCall

def charge(amount: int, *, idempotency_key: str) -> str:
    '''Charge the customer.'''
    with open(os.environ["SERVICE"], "a") as fh:
        fh.write(f"{amount} {idempotency_key}\\n")
    print("charging", flush=True)
    time.sleep(float(os.environ.get("STEP_S", "0")))
    return f"charged {amount}"

def llm(messages, tools):
    if not any(m.get("role") == "tool" for m in messages):
        call = ToolCall(id="call_1", name="charge", arguments={"amount": 5})
        return LLMResponse(text=None, tool_calls=[call], provider="scripted")
    return LLMResponse(text="done: " + messages[-1]["content"], provider="scripted")

agent = afk.Agent("payer", "Pay.", llm, tools={"charge": charge}, entrypoint="payer_mod:agent")
"""

START = """
import sys, payer_mod, afk_local as afk
afk.AgentRunner(afk.Store(sys.argv[1])).run(payer_mod.agent, "pay", run_id="a")
"""


def _cli(root: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return proc.python(
        ["-m", "afk_local", "--root", str(root), *args], env={**os.environ, **env}, timeout=120
    )


def test_a_gone_agent_is_marked_unresumable_and_a_later_resume_clears_the_mark(
    tmp_path: Path,
) -> None:
    mods, root = tmp_path / "mods", tmp_path / "store"
    mods.mkdir()
    module = mods / "payer_mod.py"
    module.write_text(MODULE)
    env = {
        "PYTHONPATH": os.pathsep.join([str(mods), str(REPO)]),
        "SERVICE": str(tmp_path / "service.log"),
    }
    child = proc.spawn(START, str(root), env={**env, "STEP_S": "30"})
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "charging", child.stderr
    child.kill()
    child.communicate(timeout=30)
    assert child.returncode == -signal.SIGKILL

    moved = module.rename(mods / "payments.py")  # the module was renamed
    gone = _cli(root, env, "resume", "a")
    assert gone.returncode == 2, gone.stderr
    assert len(gone.stderr.strip().splitlines()) == 1, gone.stderr
    listed = {r["run_id"]: r for r in json.loads(_cli(root, env, "runs", "--json").stdout)}
    assert listed["a"]["cannot_resume"], listed["a"]  # what the watcher reads to skip it
    assert afk.Store(root).read_meta("a").status is afk.RunStatus.RUNNING  # not failed

    moved.rename(module)  # the agent is back
    done = _cli(root, env, "resume", "a")
    assert done.returncode == 0, done.stderr
    meta = afk.Store(root).read_meta("a")
    assert meta.status is afk.RunStatus.COMPLETED
    assert "unresumable" not in meta.extra  # the attempt that found it cleared the mark
