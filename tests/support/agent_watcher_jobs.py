"""Agents another process can rebuild, for tests/test_agent_watcher.py (importable by children).

- ``researcher``: a module-level ``Agent``; runs record ``agent_watcher_jobs:researcher``
  (found by identity). Its outside files go to ``$AFK_TEST_AGENT_OUT``.
- ``build(context)``: an ``@afk.agent_factory`` named by ``Agent(entrypoint=...)``; the run's
  ``context`` says where the outside files go and how the agent behaves, so a
  fresh process rebuilds the very same agent.

The scripted LLM and the tools come from ``agent_jobs`` (one line per real call
in ``llm.log`` / ``effects.log``). :func:`child` runs one agent run in a child
process and can SIGKILL itself at a precise point (``agent_jobs._install_kills``).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agent_jobs import ScriptedLLM, _install_kills, append, make_tools, summary

import afk_local as afk
from afk_local.agent.types import Tool

OUT = Path(os.environ.get("AFK_TEST_AGENT_OUT") or tempfile.gettempdir())

researcher = afk.Agent(
    "researcher",
    "You are a test agent.",
    ScriptedLLM(OUT, 3, 2),
    make_tools(OUT),
    model="scripted",
    max_steps=8,
    parallel_tools=False,
    llm_retries=0,
    retry_backoff_s=0.0,
)


def _slow(fn: Any, delay: float, out: Path) -> Any:
    """``fn`` spending ``delay`` seconds *inside* the call, before its side effect.

    ``begun.log`` gets a line when a call starts: more lines there than in
    ``effects.log`` means a call is in flight.
    """

    def slow(step: int, i: int) -> Any:
        append(out / "begun.log", f"{fn.__name__} s{step}c{i}")
        time.sleep(delay)
        return fn(step=step, i=i)

    slow.__name__ = fn.__name__
    slow.__doc__ = fn.__doc__
    return slow


@afk.agent_factory
def build(context: dict[str, Any]) -> afk.Agent:
    """The agent of ``context``: out, steps, per_step, parallel, approval, delay (tool seconds)."""
    out = Path(context["out"])
    steps = int(context.get("steps", 3))
    per_step = int(context.get("per_step", 2))
    tools: dict[str, Any] = make_tools(out)
    delay = float(context.get("delay", 0.0))
    if delay:
        plain = {name for name, value in tools.items() if not isinstance(value, Tool)}
        tools = {
            name: _slow(tools[name], delay, out) if name in plain else tools[name] for name in tools
        }
    return afk.Agent(
        "builder",
        "You are a test agent.",
        ScriptedLLM(out, steps, per_step, approval=bool(context.get("approval"))),
        tools,
        model="scripted",
        max_steps=steps + 5,
        parallel_tools=bool(context.get("parallel", False)),
        llm_retries=0,
        retry_backoff_s=0.0,
        entrypoint="agent_watcher_jobs:build",
    )


def child(argv: list[str]) -> None:
    """``argv[0]``: JSON {root, run_id, agent: "researcher"|"build", context, kill, durability}."""
    job = json.loads(argv[0])
    _install_kills(job.get("kill") or {})
    runner = afk.AgentRunner(job["root"], durability=job.get("durability", "sync"))
    context = job.get("context") or {}
    agent = researcher if job["agent"] == "researcher" else build(context)
    result = runner.run(agent, "research afk_local", run_id=job["run_id"], context=context)
    print(json.dumps(summary(result)), flush=True)


CHILD = (
    f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
    "import agent_watcher_jobs; agent_watcher_jobs.child(sys.argv[1:])"
)


if __name__ == "__main__":  # pragma: no cover
    child(sys.argv[1:])
