"""Durable OpenAI Agents SDK runs on afk_local files (``pip install 'afk_local[openai-agents]'``).

:class:`DurableRunner` is a drop-in for the SDK's ``Runner.run`` / ``Runner.run_sync`` in the
shape users know from ``DBOSRunner``, with a run directory in place of a database, called
as ``Runner`` is. Inside an ``@afk.durable`` job (it finds the job's context; passing the
``ctx`` first works too), every model call (``Model.get_response``), every function tool
call and every handoff of the agent run is one journaled step of the job (``ctx.astep``):
after a kill, the resumed job replays the model responses, tool results and handoffs it
already has and continues from the first call that did not finish. Outside a job,
``DurableRunner.run_sync(agent, input, run_id=...)`` makes the agent run a durable run of
its own (:mod:`.standalone`). Model responses are stored as JSON through the SDK's own
pydantic models and usage serializer (with the request's new input items beside them, for
``afk-local show``), tool results as their JSON form (``pydantic_core.to_jsonable_python``);
nothing is pickled. Tool calls that need approval (``needs_approval``) become an afk_local
pause answered from any process.

:class:`RunSession` is the SDK's ``Session`` (like its ``SQLiteSession``) keeping a
conversation's history in a run's files.

>>> agent = Agent(name="billing", tools=[send_invoice])  # doctest: +SKIP
>>> @afk.durable  # doctest: +SKIP
... def job(ctx: afk.RunContext, prompt: str) -> str:
...     return DurableRunner.run_sync(agent, prompt).final_output
>>> DurableRunner.run_sync(agent, "bill ada", run_id="bill-ada")  # doctest: +SKIP
"""

from __future__ import annotations

from afk_local.integrations.openai_agents.journaled import tool_idempotency_key
from afk_local.integrations.openai_agents.runner import DurableRunner
from afk_local.integrations.openai_agents.session import RunSession

__all__ = ["DurableRunner", "RunSession", "tool_idempotency_key"]
