"""A pydantic-ai agent that survives kill -9: its model answers and tool results are journaled.

    pip install 'afk_local[pydantic-ai]'
    python examples/pydantic_ai_agent.py      # bills ada; run it again: the stored answer
    afk-local show bill-ada                   # the run, its steps and effects

The model here is a scripted FunctionModel so the example runs offline; put
Agent("openai:gpt-5") (or any pydantic-ai model) in its place for a real one.
"""

from __future__ import annotations

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import afk_local as afk
from afk_local.integrations.pydantic_ai import DurableAgent, tool_idempotency_key


def scripted_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Asks for the invoice once, then reports what the tool returned."""
    returned = [p.content for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
    if not returned:
        call = ToolCallPart("send_invoice", {"customer": "ada", "amount": 42})
        return ModelResponse(parts=[call])
    return ModelResponse(parts=[TextPart(f"Done: {returned[0]}")])


agent = Agent(FunctionModel(scripted_model), instructions="Bill the customer once.")


@agent.tool_plain
def send_invoice(customer: str, amount: int) -> str:
    """The side effect: a billing service that drops a call whose key it already saw."""
    key = tool_idempotency_key()  # the same on every attempt of this tool call
    return f"invoice sent to {customer} for {amount} EUR (key {key[:8]}...)"


# send_invoice may be called again after a crash cut it short: it passes on its key.
durable_agent = DurableAgent(agent, idempotent_tools={"send_invoice"})


@afk.durable
def bill(ctx: afk.RunContext, customer: str) -> str:
    """One durable run: each model request and tool call is a journaled step."""
    return durable_agent.run_sync(ctx, f"Bill {customer} 42 EUR.").output


if __name__ == "__main__":
    print(bill.run("ada", run_id="bill-ada"))
