"""The standalone agent forms swept by ``kill_sweep`` (test_agent_forms_sweep.py).

Importable as ``agent_sweep_jobs`` by the sweep's children, and by ``afk-local resume``
and the watcher, which import the module-level ``DurableAgent`` and ``Agent`` a
standalone run names. Each model asks for ``record`` of ``a``, then of ``b``, then
reports; it writes ``model asked N`` to the sweep's effect log for each question it is
asked (once: see ``sweep_jobs.asked``), and the tool writes ``record ITEM`` each time it runs
(it is not idempotent), so the sweep sees a repeated effect.
"""

from __future__ import annotations

import asyncio
from typing import Any

from sweep_jobs import asked

import afk_local as afk
from afk_local.testing import record_effect

PROMPT = "Record a, then b."


def _record(item: str) -> str:
    record_effect(f"record {item}")
    return f"{item}-ok"


# -- pydantic-ai: DurableAgent on its own, and in a job without ctx ----------------------

try:
    from pydantic_ai import Agent as PaiAgent
    from pydantic_ai.messages import (
        ModelMessage,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from afk_local.integrations.pydantic_ai import DurableAgent
except ImportError:  # the tests skip, naming the package
    pass
else:

    def _pai_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        done = [str(p.content) for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        asked(len(done) + 1)
        if len(done) < 2:
            item = "ab"[len(done)]
            return ModelResponse(parts=[ToolCallPart("record", {"item": item}, f"call-{item}")])
        return ModelResponse(parts=[TextPart("recorded " + ", ".join(done))])

    pai_agent = PaiAgent(FunctionModel(_pai_model), instructions="Record a, then b.")
    pai_agent.tool_plain(_record, name="record")
    pai_durable = DurableAgent(pai_agent)
    """Module-level, so ``afk-local resume`` and the watcher continue its standalone runs."""

    def pai_standalone(prompt: str, *, run_id: str) -> str:
        """``DurableAgent.run_sync(prompt, run_id=...)``: the agent run is a run of its own."""
        output: str = pai_durable.run_sync(prompt, run_id=run_id).output
        return output

    @afk.durable
    def pai_in_job(ctx: afk.RunContext, prompt: str) -> str:
        """``DurableAgent.run_sync(prompt)`` in a job, called as pydantic-ai's is (no ctx)."""
        output: str = pai_durable.run_sync(prompt).output
        return output


# -- the Agents SDK: DurableRunner on its own, and RunSession in a job --------------------

try:
    from agents import Agent, Model, set_tracing_disabled
    from agents.items import ModelResponse as OaResponse
    from agents.tool import function_tool
    from agents.usage import Usage
    from openai_agents_jobs import message, tool_call, tool_outputs

    from afk_local.integrations.openai_agents import DurableRunner, RunSession
except ImportError:
    pass
else:
    set_tracing_disabled(True)

    class _Recorder(Model):
        """Asks for ``record`` of ``a``, then of ``b``, then reports what it returned."""

        async def get_response(
            self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
        ) -> Any:
            items = [{"role": "user", "content": input}] if isinstance(input, str) else input
            done = tool_outputs(list(items))
            asked(len(done) + 1)
            if len(done) < 2:
                item = "ab"[len(done)]
                output = [tool_call("record", {"item": item}, f"call-{item}")]
            else:
                output = [message("recorded " + ", ".join(done))]
            return OaResponse(output=output, usage=Usage(requests=1), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    oa_agent = Agent(
        name="recorder",
        instructions="Record a, then b.",
        model=_Recorder(),
        tools=[function_tool(_record, name_override="record")],
    )
    """Module-level, so ``afk-local resume`` and the watcher find it for standalone runs."""

    def oa_standalone(prompt: str, *, run_id: str) -> str:
        """``DurableRunner.run_sync(agent, input, run_id=...)``: a run of its own."""
        return str(DurableRunner.run_sync(oa_agent, prompt, run_id=run_id).final_output)

    @afk.durable
    def oa_session_job(ctx: afk.RunContext, prompt: str) -> dict[str, Any]:
        """The agent with its conversation in ``RunSession("chat")``; returns what it keeps.

        The history read after the run shows an item added twice or lost by a kill.
        """
        session = RunSession("chat", store=ctx.store)
        result = DurableRunner.run_sync(oa_agent, prompt, session=session)
        items = asyncio.run(session.get_items())
        kept = [str(i.get("type") or i.get("role")) for i in items if isinstance(i, dict)]
        return {"output": str(result.final_output), "history": kept}
