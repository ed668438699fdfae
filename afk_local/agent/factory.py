"""``@afk.agent_factory``: the functions ``afk-local resume`` and the watcher may call.

A run records where its agent comes from (``RunMeta.entrypoint``). When that names
a function, another process must call it to rebuild the agent, and calling what a
file on disk names is exactly what an attacker who can write that file wants. So
only functions registered with this decorator are ever called
(:func:`afk_local.agent.rebuild.load_agent` checks the resolved object's type); a
module-level ``Agent`` is used as it is.

Example:
    >>> import afk_local as afk
    >>> @afk.agent_factory  # doctest: +SKIP
    ... def build(context):
    ...     return afk.Agent("helper", "You help.", llm, tools, entrypoint="mypkg.agents:build")
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from afk_local.agent.types import Agent

_FACTORIES: dict[str, AgentFactory] = {}


class AgentFactory:
    """A function registered with :func:`agent_factory`; calling it calls the function."""

    def __init__(self, fn: Callable[..., Agent]) -> None:
        self.fn = fn
        self.entrypoint = f"{fn.__module__}:{fn.__qualname__}"
        """Its ``module:qualname``, for ``Agent(entrypoint=...)``."""
        functools.update_wrapper(self, fn)
        _FACTORIES[self.entrypoint] = self

    def __repr__(self) -> str:
        return f"<agent factory {self.entrypoint}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Agent:
        """Build the agent (``fn(context)`` or ``fn()``)."""
        return self.fn(*args, **kwargs)


def agent_factory(fn: Callable[..., Agent]) -> AgentFactory:
    """Register ``fn`` as a function that builds an :class:`~afk_local.Agent`.

    Name it in ``Agent(entrypoint="module:function")`` so that ``afk-local resume``
    and the watcher can rebuild the agent in a fresh process; it is called with the
    run's ``context`` dict when it takes an argument, else with none. Functions
    without this decorator are never called from a run's entrypoint.
    """
    return AgentFactory(fn)


def registered_factory(entrypoint: str) -> AgentFactory | None:
    """The factory this process registered as ``module:qualname``, if any."""
    return _FACTORIES.get(entrypoint)


__all__ = ["AgentFactory", "agent_factory", "registered_factory"]
