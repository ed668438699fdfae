"""Continuing an agent run with no ``Agent`` at hand: ``afk-local resume``, the watcher.

An :class:`~afk_local.AgentRunner` run records where its agent comes from
(``RunMeta.entrypoint``: ``"module:qualname"`` of a module-level ``Agent`` or
of a function returning one) and the runner's options (``extra["runner"]``).
:func:`load_agent` rebuilds the agent in a fresh process and
:func:`resume_agent` continues the run; ``afk.resume(run_id)`` and
``afk_local.agent.resume.resume_run`` (``afk-local resume RUN``) dispatch here for
agent runs (:func:`is_agent_run`).
"""

from __future__ import annotations

import inspect
from typing import Any

from afk_local.agent.agent_runner import _AGENTS, AgentRunner
from afk_local.agent.factory import AgentFactory
from afk_local.agent.loop import APPROVAL, NO_INPUT
from afk_local.agent.types import Agent, AgentResult
from afk_local.errors import AgentFailedError, EntrypointError, RunPaused
from afk_local.runner.code.entrypoints import import_entrypoint
from afk_local.storage.format.records import RunMeta
from afk_local.storage.store import StoreLike, as_store
from afk_local.storage.trust import require_trusted_run


def is_agent_run(meta: RunMeta) -> bool:
    """True for runs made by :class:`~afk_local.AgentRunner` (``extra["kind"] == "agent"``).

    Agent runs made before the kind was recorded are recognised by ``extra["agent"]``.
    """
    kind = meta.extra.get("kind")
    if kind is not None:
        return bool(kind == "agent")
    return meta.entrypoint is None and "agent" in meta.extra


def load_agent(meta: RunMeta) -> Agent:
    """Rebuild the :class:`Agent` of an agent run from its recorded entrypoint.

    ``module:qualname`` names a module-level ``Agent`` or an ``@afk.agent_factory``
    function returning one (called with the run's ``context`` dict when it takes a
    parameter, else with none); anything else it names is never called. Agents run
    in this process are found without importing (so a ``__main__`` agent resumes
    here). Run the trust gate first when ``meta`` comes from a store you did not
    just check (:func:`resume_agent` does).

    Raises:
        EntrypointError: no entrypoint, a subagent's run, ``__main__``/notebook
            code another process cannot import, an import failure, an object that is
            neither an Agent nor an agent factory, or a factory that raised or
            returned something else; the message says what to do.
    """
    run_id, entrypoint = meta.run_id, meta.entrypoint
    if entrypoint is None:
        if meta.extra.get("subagent"):
            reason = (
                f"it is a subagent's run, resumed by its parent run {meta.parent_run_id!r}: "
                f"resume that one (`afk-local resume {meta.parent_run_id}`)"
            )
        else:
            reason = (
                "its Agent was neither a module-level object nor given "
                "Agent(entrypoint='module:factory'), so no other process can rebuild it. "
                "Resume it from the code that made it with runner.resume(agent, run_id); "
                "define the agent at module level (or give it an entrypoint) so later runs "
                "resume with `afk-local resume` and the watcher"
            )
        raise EntrypointError(run_id, None, reason)
    found = _AGENTS.get(entrypoint)
    if found is not None:
        return found
    obj = import_entrypoint(
        run_id,
        entrypoint,
        unimportable_hint=(
            "the agent was defined in a script run as __main__ or in a notebook, which "
            "another process cannot import. Resume it from that script/notebook with "
            "runner.resume(agent, run_id) (or run it again with the same run_id), or move "
            "the agent (or a function returning it) into an importable module"
        ),
        accept=(Agent, AgentFactory),
        accept_name=(
            "an Agent or an @afk.agent_factory function (decorate the function that builds "
            "the agent with @afk.agent_factory)"
        ),
    )
    if isinstance(obj, Agent):
        return obj
    params = meta.params if isinstance(meta.params, dict) else {}
    context = dict(params.get("context") or {})
    try:
        agent = obj(context) if _takes_an_argument(obj) else obj()
    except Exception as exc:
        raise EntrypointError(
            run_id, entrypoint, f"building the agent raised {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(agent, Agent):
        raise EntrypointError(
            run_id, entrypoint, f"it returned {type(agent).__name__}, not an afk_local Agent"
        )
    return agent


def _takes_an_argument(fn: Any) -> bool:
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return any(p.kind in positional or p.kind is p.VAR_POSITIONAL for p in parameters)


def resume_agent(
    run_id: str,
    *,
    store: StoreLike = None,
    input: Any = None,
    in_doubt: Any = None,
    on_corrupt: str = "raise",
    pause_seq: int | None = None,
) -> AgentResult:
    """Continue agent run ``run_id`` with no ``Agent`` at hand: rebuilt by :func:`load_agent`.

    The same as ``AgentRunner(store, ...).resume(agent, run_id, input=...)`` with the
    runner options the run recorded (durability, flush timeout, in-doubt policy
    unless ``in_doubt`` is given). A completed, cancelled, or paused-without-input
    run is answered without importing anything. ``afk.resume(run_id)`` calls this
    for agent runs.

    Raises:
        UntrustedStoreError: the trust gate refused the run (nothing was imported).
        EntrypointError: the agent cannot be rebuilt here (the message says why).
    """
    the_store = as_store(store)
    meta = the_store.read_meta(run_id)
    if not is_agent_run(meta):
        raise EntrypointError(
            run_id, meta.entrypoint, "it is not an agent run; use afk.resume(run_id)"
        )
    options = meta.extra.get("runner")
    options = options if isinstance(options, dict) else {}
    durability = options.get("durability")
    timeout = options.get("flush_timeout_s")
    recorded = options.get("in_doubt")
    runner = AgentRunner(
        the_store,
        durability=durability if isinstance(durability, str) else "sync",
        flush_timeout_s=float(timeout) if isinstance(timeout, (int, float)) else 30.0,
        in_doubt=in_doubt if in_doubt is not None else recorded,
    )
    done = runner._settled(meta, NO_INPUT if input is None else input, pause_seq)
    if done is not None:
        return done
    meta = require_trusted_run(
        the_store, run_id, from_origin=True
    ).meta  # before anything it names is imported
    return runner.resume(
        load_agent(meta), run_id, input=input, on_corrupt=on_corrupt, pause_seq=pause_seq
    )


def resume_agent_run(
    run_id: str,
    store: StoreLike = None,
    input: Any = None,
    *,
    in_doubt: Any = None,
    pause_seq: int | None = None,
) -> Any:
    """``afk-local resume`` of an agent run, in the CLI's terms (what ``resume_run`` calls).

    Returns the final text of a completed run; raises
    :class:`~afk_local.RunPaused` for a paused one (exit 0, the prompt printed)
    and :class:`AgentFailedError` for a failed one (exit 1).
    """
    result = resume_agent(run_id, store=store, input=input, in_doubt=in_doubt, pause_seq=pause_seq)
    if result.state == "paused":
        pending = result.pending or {}
        raise RunPaused(run_id, str(pending.get("kind") or APPROVAL), pending.get("prompt"))
    if result.state == "failed":
        raise AgentFailedError(run_id, result.error)
    return result.final_text


__all__ = [
    "AgentFailedError",
    "is_agent_run",
    "load_agent",
    "resume_agent",
    "resume_agent_run",
]
