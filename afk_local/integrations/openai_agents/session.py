"""``RunSession``: an Agents SDK session whose conversation lives in a run's files.

The SDK's ``Session`` protocol (the one ``SQLiteSession`` implements) keeps the history a
``Runner.run(..., session=...)`` call reads before the model is asked and adds to after.
:class:`RunSession` keeps it as the checkpoints of one afk_local run named by the session
id: every change writes one checkpoint (``paused``, kind ``"conversation"``: the
conversation waits for its next message) holding the whole history, so a kill leaves the
history of the last change that returned, never a torn one. Successive checkpoints are
delta-encoded by the store, reads are bounded by the store's ``max_record_bytes``, files
are 0600 in 0700 directories like every run's.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agents.items import TResponseInputItem
from agents.memory.session import SessionABC
from agents.memory.session_settings import SessionSettings, resolve_session_limit
from pydantic_core import to_jsonable_python

from afk_local.errors import RunExistsError
from afk_local.storage.store import Store, StoreLike, as_store
from afk_local.storage.views.conversation import SESSION_PAUSE_KIND as CONVERSATION_PAUSE

_ITEMS = "items"
_APPLIED = "applied"
_APPLIED_KEPT = 64  # keys of the last adds, so that a repeated keyed add is dropped


class RunSession(SessionABC):
    """Conversation history for ``Runner.run(..., session=RunSession("chat-42"))``, in a run.

    The session id is the run id (``afk-local show chat-42`` shows the history's
    checkpoints; ``afk-local rm --force`` removes it). A process that changes the history
    holds the run's lock for that change only, so several processes may take turns in
    one conversation (one waits up to ``lock_timeout`` for another's change); the
    history a change writes is the one it read under the lock.

    Args:
        session_id: the conversation's id, a valid run id.
        store: the store (a path, or None for ``$AFK_LOCAL_ROOT`` or ``./.afk``).
        session_settings: the SDK's session settings (``limit`` bounds what
            ``get_items()`` returns without a limit).
        lock_timeout: seconds a change waits for another process's change to the same
            conversation before ``RunLockedError``.
    """

    def __init__(
        self,
        session_id: str,
        *,
        store: StoreLike = None,
        session_settings: SessionSettings | None = None,
        lock_timeout: float = 10.0,
    ) -> None:
        self._store: Store = as_store(store)
        self._lock_timeout = lock_timeout
        self._store.paths(session_id)  # an invalid run id is refused here, not at first use
        self.session_id = session_id
        self.session_settings = session_settings or SessionSettings()

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The conversation so far, oldest first; with ``limit``, its last ``limit`` items."""
        items = await asyncio.to_thread(self._read)
        count = resolve_session_limit(limit, self.session_settings)
        if count is None:
            return items
        return items[-count:] if count > 0 else []

    async def add_items(
        self, items: list[TResponseInputItem], *, idempotency_key: str | None = None
    ) -> None:
        """Append ``items`` to the conversation, durably before it returns.

        An add with an ``idempotency_key`` that one of the last adds had is dropped
        (what a durable job's resume sends when a kill cut its first add short).
        """
        if not items:
            return
        added = to_jsonable_python(list(items))
        await asyncio.to_thread(self._change, lambda history: [*history, *added], idempotency_key)

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove and return the newest item; None when the conversation is empty."""
        popped: list[TResponseInputItem] = []

        def drop_last(history: list[Any]) -> list[Any]:
            popped.extend(history[-1:])
            return history[:-1]

        await asyncio.to_thread(self._change, drop_last)
        return popped[0] if popped else None

    async def clear_session(self) -> None:
        """Forget the conversation (a checkpoint with no items; the run stays)."""
        await asyncio.to_thread(self._change, lambda history: [])

    def _read(self) -> list[Any]:
        if not self._store.exists(self.session_id):
            return []
        latest = self._store.open(self.session_id).latest()
        return _items_of(self.session_id, latest.payload if latest is not None else None)

    def _change(self, change: Any, idempotency_key: str | None = None) -> None:
        """Read the history under the run's lock, change it, write it as one checkpoint."""
        try:
            writer = self._store.create(self.session_id, thread_id=self.session_id)
        except RunExistsError:
            writer = self._store.resume_writer(
                self.session_id, lock_timeout=self._lock_timeout, new_attempt=False
            )
        with writer:
            latest = writer.reader().latest() if writer.seq else None
            payload = latest.payload if latest is not None else None
            history = _items_of(self.session_id, payload)
            applied = [str(k) for k in (payload or {}).get(_APPLIED, ())][-_APPLIED_KEPT:]
            if idempotency_key is not None:
                if idempotency_key in applied:
                    return
                applied = [*applied, idempotency_key][-_APPLIED_KEPT:]
            new = change(history)
            if new == history and latest is not None:
                return
            writer.pause(CONVERSATION_PAUSE, None, items=new, applied=applied)


def _items_of(session_id: str, payload: Any) -> list[Any]:
    if payload is None:
        return []
    items = payload.get(_ITEMS) if isinstance(payload, dict) else None
    if not isinstance(items, list):
        raise ValueError(
            f"run {session_id!r} is not a RunSession conversation: its newest checkpoint "
            "holds no item list: pick another session id, or remove that run "
            f"(`afk-local cancel {session_id}` if it has not finished, then "
            f"`afk-local rm {session_id} --force`)"
        )
    return items
