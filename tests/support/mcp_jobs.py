"""Durable agents whose tool is on a real MCP server (``mcp_server.py`` on stdio).

Importable as ``mcp_jobs`` by the children of the MCP tests and sweeps. Each model is
scripted: it asks the MCP tool ``charge`` for ada once, then reports what it returned;
each question it is asked writes ``model asked N`` to the sweep's effect log once (and the
server's tool writes ``charge ada 42``), so a sweep sees a repeated question or charge.
The server is started by the agent run (stdio), with this process's environment.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from sweep_jobs import asked

import afk_local as afk

SERVER = Path(__file__).with_name("mcp_server.py")
PROMPT = "Charge ada 42 EUR."


# -- pydantic-ai: an MCPToolset ---------------------------------------------------------

try:
    from fastmcp.client.transports import PythonStdioTransport
    from pydantic_ai import Agent as PaiAgent
    from pydantic_ai.mcp import MCPToolset
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
        returned = [p.content for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        asked(len(returned) + 1)
        if not returned:
            call = ToolCallPart("charge", {"customer": "ada", "amount": 42}, tool_call_id="mcp-1")
            return ModelResponse(parts=[call])
        return ModelResponse(parts=[TextPart(f"done: {returned[0]}")])

    billing = MCPToolset(
        PythonStdioTransport(SERVER, env=dict(os.environ), python_cmd=sys.executable),
        id="billing",
        init_timeout=120,
        read_timeout=120,
    )
    pai_agent = PaiAgent(FunctionModel(_pai_model), toolsets=[billing])
    pai_durable = DurableAgent(pai_agent)

    @afk.durable
    def pai_mcp_job(ctx: afk.RunContext, prompt: str) -> str:
        """The pydantic-ai agent with its MCP tool, as a job (called as pydantic-ai is)."""
        output: str = pai_durable.run_sync(prompt).output
        return output


# -- the Agents SDK: an MCPServerStdio --------------------------------------------------

try:
    from agents import Agent, Model, set_tracing_disabled
    from agents.items import ModelResponse as OaResponse
    from agents.mcp import MCPServerStdio
    from agents.usage import Usage
    from openai_agents_jobs import message, tool_call

    from afk_local.integrations.openai_agents import DurableRunner
except ImportError:
    pass
else:
    set_tracing_disabled(True)

    class _OaModel(Model):
        async def get_response(
            self, system_instructions: Any, input: Any, *a: Any, **k: Any
        ) -> Any:
            items = [{"role": "user", "content": input}] if isinstance(input, str) else input
            returned = [
                i["output"]
                for i in items
                if isinstance(i, dict) and i.get("type") == "function_call_output"
            ]
            asked(len(returned) + 1)
            if not returned:
                output = [tool_call("charge", {"customer": "ada", "amount": 42}, "mcp-1")]
            else:
                text = returned[0] if isinstance(returned[0], str) else str(returned[0])
                output = [message(f"done: {text}")]
            return OaResponse(output=output, usage=Usage(requests=1), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    oa_agent = Agent(name="billing", instructions="Charge once.", model=_OaModel())

    def _server() -> MCPServerStdio:
        params = {"command": sys.executable, "args": [str(SERVER)], "env": dict(os.environ)}
        return MCPServerStdio(params, name="billing", client_session_timeout_seconds=60)

    @afk.durable
    async def oa_mcp_job(ctx: afk.RunContext, prompt: str) -> str:
        """The Agents SDK agent with the MCP server's tool, as a job."""
        async with _server() as server:
            agent = oa_agent.clone(mcp_servers=[server])
            result = await DurableRunner.run(agent, prompt)
        return str(result.final_output)
