"""Durable pydantic-ai agents on afk_local files (``pip install 'afk_local[pydantic-ai]'``).

:class:`DurableAgent` wraps a pydantic-ai agent the way pydantic-ai's own ``DBOSAgent`` and
``TemporalAgent`` do, with a run directory in place of a database or a server. Every model
request and every tool call of ``run``/``run_sync`` is one journaled step: after a kill,
the resumed run replays the model responses and tool results it already has and continues
from the first call that did not finish. Call it inside an ``@afk.durable`` job (the calls
are steps of the job) or on its own with a ``run_id`` (the agent run is a run of its own).
Model responses are stored with pydantic-ai's own ``ModelMessagesTypeAdapter`` (JSON),
tool results as their JSON form (``pydantic_core.to_jsonable_python``); nothing is pickled.

>>> agent = Agent(model, tools=[send_mail])  # doctest: +SKIP
>>> durable_agent = DurableAgent(agent, idempotent_tools={"send_mail"})  # doctest: +SKIP
>>> durable_agent.run_sync("mail ada", run_id="mail-ada").output  # doctest: +SKIP
>>> @afk.durable  # doctest: +SKIP
... def job(ctx: afk.RunContext, prompt: str) -> str:
...     return durable_agent.run_sync(ctx, prompt).output
"""

from __future__ import annotations

from afk_local.integrations.pydantic_ai.agent import DurableAgent
from afk_local.integrations.pydantic_ai.steps import tool_idempotency_key

__all__ = ["DurableAgent", "tool_idempotency_key"]
