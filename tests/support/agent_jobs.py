"""A scripted, deterministic agent for the agent tests, importable by child processes.

The LLM and the tools append one line per real call to files in an outside
directory (``llm.log``, ``effects.log``), so "exactly once" is checked by
counting lines. :func:`child_main` runs or resumes a run in a child process and
can SIGKILL itself at a precise point (after the N-th checkpoint file, after a
given phase, after a given journal outcome).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import afk_local as afk
from afk_local.agent.types import Tool
from afk_local.journal.journal import Journal
from afk_local.storage.rundir.write.writer import RunWriter

_lock = threading.Lock()


def append(path: Path, line: str) -> None:
    with _lock, open(path, "a", encoding="utf-8") as fh:
        fh.write(line + "\n")
        fh.flush()


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


class ScriptedLLM:
    """Step n (1-based) asks for ``per_step`` tool calls until ``steps``; then answers.

    ``fail_at``: raise at that step while the file ``out/fail`` exists.
    ``subagent``: at step 1 the first call goes to the ``researcher`` subagent.
    """

    def __init__(
        self,
        out: Path,
        steps: int,
        per_step: int = 2,
        *,
        fail_at: int | None = None,
        subagent: bool = False,
        approval: bool = False,
        name: str = "llm",
    ) -> None:
        self.out = Path(out)
        self.steps = steps
        self.per_step = per_step
        self.fail_at = fail_at
        self.subagent = subagent
        self.approval = approval
        self.name = name

    def __call__(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        n = sum(m["role"] == "assistant" for m in messages) + 1
        append(self.out / f"{self.name}.log", f"step{n}")
        if self.fail_at == n and (self.out / "fail").exists():
            raise ConnectionError(f"scripted outage at step {n}")
        usage = {"prompt_tokens": 10 * n, "completion_tokens": 3, "total_tokens": 10 * n + 3}
        if n <= self.steps:
            calls = []
            for i in range(self.per_step):
                name = "fetch" if i % 2 == 0 else "note"
                if self.subagent and n == 1 and i == 0:
                    name = "researcher"
                if self.approval and i == self.per_step - 1:
                    name = "publish"
                args: dict[str, Any] = {"step": n, "i": i}
                if name == "researcher":
                    args = {"task": f"research topic {n}"}
                calls.append(afk.ToolCall(id=f"s{n}c{i}", name=name, arguments=args))
            return afk.LLMResponse(
                text=None,
                tool_calls=calls,
                finish_reason="tool_calls",
                usage=usage,
                model="scripted-1",
                provider="scripted",
                cost_usd=0.001,
            )
        results = [m["content"] for m in messages if m["role"] == "tool"]
        return afk.LLMResponse(
            text=f"final after {n - 1} steps: " + " | ".join(results),
            finish_reason="stop",
            usage=usage,
            model="scripted-1",
            provider="scripted",
            cost_usd=0.001,
            structured={"steps": n - 1, "results": len(results)},
        )


def make_tools(out: Path) -> dict[str, Any]:
    out = Path(out)

    def fetch(step: int, i: int) -> str:
        """Fetch a page."""
        append(out / "effects.log", f"fetch s{step}c{i}")
        return f"page{step}.{i}"

    def note(step: int, i: int) -> dict[str, int]:
        """Write a note."""
        append(out / "effects.log", f"note s{step}c{i}")
        return {"noted": step * 10 + i}

    def publish(step: int, i: int) -> str:
        """Publish (needs a person's approval)."""
        append(out / "effects.log", f"publish s{step}c{i}")
        return f"published {step}"

    return {
        "fetch": fetch,
        "note": note,
        "publish": Tool(publish, name="publish", requires_approval=True),
    }


def make_agent(
    out: str | Path,
    steps: int = 3,
    per_step: int = 2,
    *,
    parallel: bool = True,
    fail_at: int | None = None,
    subagent: bool = False,
    approval: bool = False,
) -> afk.Agent:
    out = Path(out)
    tools = make_tools(out)
    if subagent:
        tools["researcher"] = afk.Agent(
            "researcher",
            "Research.",
            ScriptedLLM(out, 1, 1, name="sub_llm"),
            {"fetch": _sub_fetch(out)},
            max_steps=5,
            llm_retries=0,
        )
    return afk.Agent(
        "tester",
        "You are a test agent.",
        ScriptedLLM(out, steps, per_step, fail_at=fail_at, subagent=subagent, approval=approval),
        tools,
        model="scripted",
        max_steps=steps + 5,
        parallel_tools=parallel,
        llm_retries=0,
        retry_backoff_s=0.0,
    )


def _sub_fetch(out: Path) -> Any:
    def fetch(step: int, i: int) -> str:
        """Fetch a page (in the subagent)."""
        append(out / "sub_effects.log", f"subfetch s{step}c{i}")
        return f"subpage{step}.{i}"

    return fetch


def summary(result: afk.AgentResult) -> dict[str, Any]:
    """The parts of a result that must not depend on crashes."""
    return {
        "state": result.state,
        "final_text": result.final_text,
        "final_structured": result.final_structured,
        "usage": result.usage,
        "tool_executions": result.tool_executions,
        "steps": result.steps,
        "llm_calls": result.llm_calls,
        "messages": result.messages,
    }


def _install_kills(spec: dict[str, Any]) -> None:
    """SIGKILL this process at the point ``spec`` names (never returns from that point)."""
    after_n = spec.get("after_checkpoints")
    after_phase = spec.get("after_phase")  # [phase, run_id or None]
    after_outcome = spec.get("after_outcome")
    count = [0]
    if after_n is not None or after_phase is not None:
        original = RunWriter._write

        def write(self: RunWriter, phase: str, payload: Any, step: int, *more: Any) -> Any:
            record = original(self, phase, payload, step, *more)
            count[0] += 1
            if after_n is not None and count[0] == after_n:
                os.kill(os.getpid(), signal.SIGKILL)
            if (
                after_phase is not None
                and phase == after_phase[0]
                and after_phase[1] in (None, self.run_id)
            ):
                os.kill(os.getpid(), signal.SIGKILL)
            return record

        RunWriter._write = write  # type: ignore[method-assign]
    if after_outcome is not None:
        original_outcome = Journal.record_outcome

        def record_outcome(self: Journal, key: str, **kwargs: Any) -> Any:
            effect = original_outcome(self, key, **kwargs)
            if key == after_outcome:
                os.kill(os.getpid(), signal.SIGKILL)
            return effect

        Journal.record_outcome = record_outcome  # type: ignore[method-assign]


def child_main(argv: list[str]) -> None:
    """``argv[0]`` is a JSON job: action, root, runs ([run_id, out]...), agent, kill, input."""
    job = json.loads(argv[0])
    _install_kills(job.get("kill") or {})
    runner = afk.AgentRunner(job["root"], durability=job.get("durability", "sync"))
    results = []
    for run_id, out in job["runs"]:
        agent = make_agent(out, **job.get("agent", {}))
        if job["action"] == "run":
            result = runner.run(agent, "research afk_local", run_id=run_id)
        else:
            result = runner.resume(agent, run_id, input=job.get("input"))
        results.append(summary(result) | {"replayed": result.replayed_effect_count})
    print(json.dumps(results), flush=True)


CHILD = (
    f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import agent_jobs; "
    "agent_jobs.child_main(sys.argv[1:])"
)


if __name__ == "__main__":  # pragma: no cover
    child_main(sys.argv[1:])
