"""The agent runner: an LLM/tool loop checkpointed at every phase of the AFK protocol.

:class:`~afk_local.AgentRunner` (:mod:`~afk_local.agent.agent_runner`), the loop
(:mod:`~afk_local.agent.loop`), phase payloads (:mod:`~afk_local.agent.state`),
journaled tools (:mod:`~afk_local.agent.tools`), rebuilding an agent in a fresh
process (:mod:`~afk_local.agent.rebuild`), and ``afk.resume`` for every kind of
run (:mod:`~afk_local.agent.resume`). The names of :mod:`~afk_local.agent.agent_runner`
are re-exported here (``afk.agent.tool``, ``afk.agent.Tool``, ...).
"""

from __future__ import annotations

from afk_local.agent.agent_runner import (
    AGENT_KIND,
    Agent,
    AgentResult,
    AgentRunner,
    LLMFailedError,
    LLMResponse,
    MaxStepsError,
    SubagentFailedError,
    Tool,
    ToolCall,
    ToolFailedError,
    decision,
    tool,
)

__all__ = [
    "AGENT_KIND",
    "Agent",
    "AgentResult",
    "AgentRunner",
    "LLMFailedError",
    "LLMResponse",
    "MaxStepsError",
    "SubagentFailedError",
    "Tool",
    "ToolCall",
    "ToolFailedError",
    "decision",
    "tool",
]
