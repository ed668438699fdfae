"""A LangGraph checkpointer on afk_local run directories (extra ``[langgraph]``).

``from afk_local.integrations.langgraph import AfkLocalSaver``. The saver
(:mod:`~afk_local.integrations.langgraph.saver`) adapts LangGraph's API; the
other modules hold the files and import no LangGraph. See docs/langgraph.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from afk_local.integrations.langgraph import saver as _saver
from afk_local.integrations.langgraph.saver import AfkLocalSaver

if TYPE_CHECKING:
    from afk_local.integrations.langgraph.saver import (
        INDEX_NAME,
        INTEGRATION,
        PHASE,
        RUN_PREFIX,
        WRITES_NAME,
        thread_run_id,
    )


def __getattr__(name: str) -> Any:
    """The file names and ``thread_run_id``, loaded with the storage side on first use."""
    return getattr(_saver, name)


__all__ = [
    "INDEX_NAME",
    "INTEGRATION",
    "PHASE",
    "RUN_PREFIX",
    "WRITES_NAME",
    "AfkLocalSaver",
    "thread_run_id",
]
