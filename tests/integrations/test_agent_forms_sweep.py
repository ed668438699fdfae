"""The standalone agent forms killed at durable I/O calls by ``kill_sweep``, resumed, compared.

``DurableAgent.run_sync(prompt, run_id=...)`` (a run of its own), ``DurableAgent.run_sync(
prompt)`` in a job without ``ctx``, ``DurableRunner.run_sync(agent, input, run_id=...)``
and ``RunSession`` kept by a ``DurableRunner`` run in a job. Each is run once
uninterrupted, then SIGKILLed at a durable I/O call and resumed by ``afk-local resume``,
``afk-local watch --once`` or the same call (in turn): it must end as the uninterrupted
run did, every model question and every tool effect once (a tool call a kill cut short
is reported in doubt, never run twice). The default suite tries two kill points per
form (``kill_sweep`` fixture); ``--torture`` every point, and a second kill in each
resume. Jobs: tests/support/agent_sweep_jobs.py. The in-job forms with ``ctx`` and
parallel tools: test_agent_sweep.py; AgentRunner: tests/testing/test_kill_sweep.py.
"""

from __future__ import annotations

from typing import Any

import pytest

RECORDED = ("model asked 1", "record a", "model asked 2", "record b", "model asked 3")
BOUND = 300.0
"""Seconds one child may take before it counts as a hang: importing the agent frameworks
takes half a minute on a loaded two-core machine."""


def _needs(package: str) -> None:
    pytest.importorskip(
        package, reason=f"{package} not installed: pip install 'afk_local[test-all]'"
    )


def _said(result: dict[str, Any]) -> dict[str, Any]:
    """A pydantic-ai run's stored result without what differs between two equal runs
    (timestamps, run ids, usage): its output and each message's parts as sent."""
    parts = [
        [(p["part_kind"], p.get("tool_name"), p.get("content"), p.get("args")) for p in m["parts"]]
        for m in result["messages"]
    ]
    return {"output": result["output"], "parts": parts}


def test_a_standalone_durable_agent_run_ends_as_uninterrupted(kill_sweep) -> None:
    _needs("pydantic_ai")
    import agent_sweep_jobs as jobs  # noqa: PLC0415 - after the skip

    swept = kill_sweep(
        "agent_sweep_jobs:pai_standalone", jobs.PROMPT, compare=_said, timeout=BOUND
    ).check()
    assert swept.result["output"] == "recorded a-ok, b-ok"
    assert swept.effects == RECORDED


def test_a_durable_agent_in_a_job_without_ctx_ends_as_uninterrupted(kill_sweep) -> None:
    _needs("pydantic_ai")
    import agent_sweep_jobs as jobs  # noqa: PLC0415

    swept = kill_sweep(jobs.pai_in_job, jobs.PROMPT, timeout=BOUND).check()
    assert swept.result == "recorded a-ok, b-ok"
    assert swept.effects == RECORDED


def test_a_standalone_durable_runner_run_ends_as_uninterrupted(kill_sweep) -> None:
    _needs("agents")
    import agent_sweep_jobs as jobs  # noqa: PLC0415

    swept = kill_sweep("agent_sweep_jobs:oa_standalone", jobs.PROMPT, timeout=BOUND).check()
    assert swept.result == {"final_output": "recorded a-ok, b-ok", "last_agent": "recorder"}
    assert swept.effects == RECORDED


def test_a_run_session_kept_by_a_durable_runner_run_ends_as_uninterrupted(kill_sweep) -> None:
    _needs("agents")
    import agent_sweep_jobs as jobs  # noqa: PLC0415

    swept = kill_sweep(jobs.oa_session_job, jobs.PROMPT, timeout=BOUND).check()
    # the session holds the prompt, each call and its output, and the answer: each once
    assert swept.result["history"] == [
        "user",
        "function_call",
        "function_call_output",
        "function_call",
        "function_call_output",
        "message",
    ]
    assert swept.effects == RECORDED
