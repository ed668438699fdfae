"""A LangGraph checkpointer on afk_local run directories (extra ``[langgraph]``).

``from afk_local.integrations.langgraph import AfkLocalSaver``. The saver
(:mod:`~afk_local.integrations.langgraph.saver`) adapts LangGraph's API; the
other modules hold the files and import no LangGraph. See docs/langgraph.md.
"""

from __future__ import annotations

from afk_local.integrations.langgraph.saver import (
    INDEX_NAME,
    INTEGRATION,
    PHASE,
    RUN_PREFIX,
    WRITES_NAME,
    AfkLocalSaver,
    thread_run_id,
)

__all__ = [
    "INDEX_NAME",
    "INTEGRATION",
    "PHASE",
    "RUN_PREFIX",
    "WRITES_NAME",
    "AfkLocalSaver",
    "thread_run_id",
]
