"""An Agents SDK agent that survives kill -9: its model answers and tool results are journaled.

    pip install 'afk_local[openai-agents]'
    python examples/openai_agents_agent.py    # bills ada; run it again: the stored answer
    afk-local show bill-ada                   # the run, its steps and effects
    afk-local show chat-ada                   # the conversation, kept by RunSession
    afk-local inspect bill-ada --conversation # the run's prompt, tool calls and answers

The model here is scripted so the example runs offline; drop `model=` (the SDK's default
OpenAI model, with OPENAI_API_KEY set) or put any agents.Model in its place for a real one.
"""

from __future__ import annotations

from typing import Any

from agents import Agent, Model, function_tool, set_tracing_disabled
from agents.items import ModelResponse
from agents.usage import Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

import afk_local as afk
from afk_local.integrations.openai_agents import DurableRunner, RunSession, tool_idempotency_key


class ScriptedModel(Model):
    """Asks for the invoice once, then reports what the tool returned."""

    async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any):
        items = input if isinstance(input, list) else [{"role": "user", "content": input}]
        returned = [i["output"] for i in items if i.get("type") == "function_call_output"]
        if not returned:
            arguments = '{"customer": "ada", "amount": 42}'
            output: list[Any] = [
                ResponseFunctionToolCall(
                    type="function_call", name="send_invoice", arguments=arguments, call_id="c1"
                )
            ]
        else:
            text = ResponseOutputText(
                type="output_text", text=f"Done: {returned[0]}", annotations=[]
            )
            output = [
                ResponseOutputMessage(
                    type="message", id="m1", role="assistant", status="completed", content=[text]
                )
            ]
        return ModelResponse(output=output, usage=Usage(requests=1), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any):
        raise NotImplementedError


set_tracing_disabled(True)  # the scripted model needs no key; traces would go to OpenAI


@function_tool
def send_invoice(customer: str, amount: int) -> str:
    """The side effect: a billing service that drops a call whose key it already saw."""
    key = tool_idempotency_key()  # the same on every attempt of this tool call
    return f"invoice sent to {customer} for {amount} EUR (key {key[:8]}...)"


agent = Agent(
    name="billing",
    instructions="Bill the customer once.",
    model=ScriptedModel(),
    tools=[send_invoice],
)


@afk.durable
def bill(ctx: afk.RunContext, customer: str) -> str:
    """One durable run: each model call and tool call is a journaled step."""
    # Called as Runner.run_sync is: DurableRunner finds the job it runs in.
    # send_invoice may be called again after a crash cut it short: it passes on its key.
    # The conversation is kept in the run "chat-ada" (RunSession works with Runner.run too).
    result = DurableRunner.run_sync(
        agent,
        f"Bill {customer} 42 EUR.",
        idempotent_tools={"send_invoice"},
        session=RunSession(f"chat-{customer}", store=ctx.store),
    )
    return str(result.final_output)


if __name__ == "__main__":
    print(bill.run("ada", run_id="bill-ada"))
