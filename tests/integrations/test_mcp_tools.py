"""MCP tool calls of durable agents are journaled: a run killed after the tool ran does not
call it again when it resumes.

The server is real: ``tests/support/mcp_server.py`` on stdio (the ``mcp`` package), started
by the agent run in the child (pydantic-ai's ``MCPToolset``, the Agents SDK's
``MCPServerStdio``). Its tool writes ``charge ada 42`` to the effect log each time it runs.
A child is SIGKILLed right before the agent's third step (the model call after the tool),
then the same call finishes the run. ``--torture`` also sweeps every durable I/O
call with ``kill_sweep`` (each child starts the server, so it is not in the default suite).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import afk_local as afk
from afk_local.testing import SWEEP_LOG_ENV, run_and_kill

FRAMEWORKS = {
    "pydantic-ai": ("pydantic_ai.mcp", "pai_mcp_job", "pydantic-ai.tool.charge.mcp-1#1"),
    "openai-agents": ("agents.mcp", "oa_mcp_job", "openai-agents.tool.charge.mcp-1#1"),
}


def _job(framework: str) -> afk.DurableFunction[str]:
    module, name, _ = FRAMEWORKS[framework]
    pytest.importorskip(module, reason=f"{module} not installed: pip install 'afk_local[test-all]'")
    import mcp_jobs  # noqa: PLC0415 - after the skip: it imports the framework

    return getattr(mcp_jobs, name)  # type: ignore[no-any-return]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_an_mcp_tool_that_ran_before_a_kill_is_not_called_again(
    framework: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = _job(framework)
    import mcp_jobs  # noqa: PLC0415

    log, root = tmp_path / "effects.log", tmp_path / "store"
    monkeypatch.setenv(SWEEP_LOG_ENV, str(log))
    monkeypatch.setenv("AFK_LOCAL_ROOT", str(root))
    # steps: model #1 (asks for the tool), the MCP tool, model #2: killed before the third
    killed = run_and_kill(job, mcp_jobs.PROMPT, at=3, on="step", store=root, run_id="bill")
    assert killed.killed, killed.stderr
    assert log.read_text().splitlines() == ["model asked 1", "charge ada 42"]

    # resumed by the same call again (here, to spare a child its imports; the sweep
    # below resumes with afk-local resume and watch --once too)
    output = job.with_store(afk.Store(root)).run(mcp_jobs.PROMPT, run_id="bill")
    assert output.startswith("done: ") and "charged ada 42 EUR" in output
    run = afk.Store(root).open("bill")
    assert run.meta.status == "completed"
    # the tool's result was replayed from the journal: the server was not asked again
    assert log.read_text().splitlines() == ["model asked 1", "charge ada 42", "model asked 2"]
    tool_step = FRAMEWORKS[framework][2]
    assert [e.kind for e in run.effects() if e.key == tool_step] == ["intent", "outcome"]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_an_mcp_tool_run_killed_at_any_durable_io_call_ends_as_uninterrupted(
    framework: str, kill_sweep, request: pytest.FixtureRequest
) -> None:
    if not request.config.getoption("--torture"):
        pytest.skip("--torture only: each child of the sweep starts the MCP server")
    job = _job(framework)
    import mcp_jobs  # noqa: PLC0415

    swept = kill_sweep(job, mcp_jobs.PROMPT, timeout=300).check()
    assert swept.effects == ("model asked 1", "charge ada 42", "model asked 2")
