"""Agent jobs whose tool list changes between attempts, for ``afk-local replay`` (issue 41).

Importable as ``replay_agent_jobs``. ``REPLAY_TOOLS=more`` gives the agent a second tool
(``lookup``), and ``REPLAY_MODEL=NAME`` another model (by name), as if the code had been
edited between two attempts; the model and its
answers are those of the crash suites' jobs (``openai_agents_jobs``, ``pydantic_ai_jobs``,
whose environment variables they need: ``OA_EFFECTS``; ``PAI_EFFECTS``, ``PAI_MODEL_LOG``).
"""

from __future__ import annotations

import os

import afk_local as afk

# Each job imports its framework itself: a child replaying one run pays for one SDK.


def lookup(item: str) -> str:
    """The tool the second version of the code adds: look ``item`` up."""
    return f"{item} found"


def _more_tools() -> bool:
    return os.environ.get("REPLAY_TOOLS") == "more"


@afk.durable
def openai_agents_job(ctx: afk.RunContext, prompt: str) -> str:
    """The Agents SDK recorder agent, with one tool more under ``REPLAY_TOOLS=more``."""
    import openai_agents_jobs as oa  # noqa: PLC0415
    from agents import function_tool  # noqa: PLC0415

    from afk_local.integrations.openai_agents import DurableRunner  # noqa: PLC0415

    tools = [oa.record, function_tool(lookup)] if _more_tools() else [oa.record]
    model = oa.ScriptedModel(oa.record_twice, "recorder")
    if os.environ.get("REPLAY_MODEL"):
        model.model = os.environ["REPLAY_MODEL"]  # type: ignore[attr-defined]
    agent = oa.recorder.clone(model=model, tools=tools)
    result = DurableRunner.run_sync(ctx, agent, prompt, idempotent_tools={"record"})
    return str(result.final_output)


@afk.durable
def pydantic_ai_job(ctx: afk.RunContext, prompt: str) -> str:
    """The pydantic-ai recorder agent, with one tool more under ``REPLAY_TOOLS=more``."""
    import pydantic_ai_jobs as pai  # noqa: PLC0415
    from pydantic_ai import Agent  # noqa: PLC0415
    from pydantic_ai.models.function import FunctionModel  # noqa: PLC0415

    from afk_local.integrations.pydantic_ai import DurableAgent  # noqa: PLC0415

    model = FunctionModel(pai.answer, model_name=os.environ.get("REPLAY_MODEL"))
    agent = Agent(model, instructions="Record a, then b.")
    agent.tool_plain(pai.record)
    if _more_tools():
        agent.tool_plain(lookup)
    output: str = DurableAgent(agent, idempotent_tools={"record"}).run_sync(ctx, prompt).output
    return output
