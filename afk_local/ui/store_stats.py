"""The store page's statistics, computed off the request and kept with their age.

Disk use by run, what gc would remove and what verify finds cost what the whole
store costs (every run read), not what the page shows. So a request never computes
them: :class:`StoreStats` computes them on a thread of its own, one computation at a
time per kind (with or without verify), and a request is served the newest result
with its age at once; a result older than :data:`MAX_AGE_S`, or a request asking for a
refresh, starts a new computation while the old result is still shown.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from afk_local.storage.store import Store
from afk_local.ui.views import StorePage, store_page

log = logging.getLogger("afk_local")

MAX_AGE_S = 300.0
"""A result older than this is recomputed on the next visit (and shown meanwhile)."""


@dataclass(frozen=True)
class Stats:
    """What the store page can show now."""

    page: StorePage | None
    """The newest result (None: none yet)."""
    age_s: float | None
    """How old it is, in seconds."""
    computing_s: float | None
    """How long a computation has been running (None: none is)."""


class _Slot:
    def __init__(self) -> None:
        self.page: StorePage | None = None
        self.done_at = 0.0
        self.started_at: float | None = None


class StoreStats:
    """The store page's statistics of one store, computed in the background."""

    def __init__(self, store: Store, *, max_age_s: float = MAX_AGE_S) -> None:
        self.store = store
        self.max_age_s = max_age_s
        self._lock = threading.Lock()
        self._slots = {False: _Slot(), True: _Slot()}

    def get(self, *, verify: bool = False, refresh: bool = False) -> Stats:
        """The newest statistics (with verify: every file checked), starting a computation
        when there are none, they are stale or ``refresh`` asks for one."""
        now = time.monotonic()
        with self._lock:
            slot = self._slots[verify]
            stale = slot.page is None or refresh or now - slot.done_at > self.max_age_s
            if stale and slot.started_at is None:
                slot.started_at = now
                threading.Thread(
                    target=self._compute, args=(verify,), name="afk-local-ui-store", daemon=True
                ).start()
            return Stats(
                page=slot.page,
                age_s=now - slot.done_at if slot.page is not None else None,
                computing_s=now - slot.started_at if slot.started_at is not None else None,
            )

    def wait(self, *, verify: bool = False, timeout: float = 60.0) -> StorePage | None:
        """Block until a computation has finished (for tests and benchmarks)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            stats = self.get(verify=verify)
            if stats.page is not None and stats.computing_s is None:
                return stats.page
            time.sleep(0.02)
        return None

    def _compute(self, verify: bool) -> None:
        page: StorePage | None = None
        try:
            page = store_page(self.store, verify=verify)
        except Exception:  # the page says nothing new; the log says why
            log.exception("ui: the store's statistics failed")
        with self._lock:
            slot = self._slots[verify]
            if page is not None:
                slot.page, slot.done_at = page, time.monotonic()
            slot.started_at = None


__all__ = ["MAX_AGE_S", "Stats", "StoreStats"]
