"""When a schedule fires: its slots (``--every`` or ``--cron``) and which are due (``--catchup``).

A *slot* is one instant the schedule names, in seconds since the epoch. ``--every D``
slots are the multiples of ``D`` since the epoch (every 3600 s fires on the hour,
UTC); ``--cron EXPR`` slots are the instants the cron expression matches in the
schedule's time zone, the machine's own by its IANA name when the schedule names none
(parsed by cronsim, the ``schedule`` extra; an hour that daylight saving time skips or
repeats is resolved as cronsim does: a daily slot in the repeated hour fires once). Only slots at or
after the schedule's creation count.

What is due at ``now`` depends on ``catchup``, for slots missed while no watcher ran
(the machine was off, asleep, the watcher stopped):

- ``latest``: the newest slot (once), however late;
- ``all``: every slot since the newest one that already has a run (at most
  :data:`MAX_CATCHUP` of them, the newest);
- ``skip``: the newest slot only while it is fresh (less than a period, at most
  :data:`SKIP_GRACE_S`, old); older ones are skipped.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import zoneinfo
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from afk_local.clock import current_clock, wall_ns

CATCHUP = ("latest", "all", "skip")
OVERLAP = ("allow", "skip", "queue")
"""What a due slot does while the schedule's previous run is unfinished (Temporal's overlap
policy): start anyway (``allow``), be skipped (``skip``), or wait for it (``queue``)."""
MAX_CATCHUP = 100
"""``--catchup all`` starts at most this many missed slots (the newest) in one sweep."""
SKIP_GRACE_S = 60.0
"""``--catchup skip``: a slot still starts this long after its time (or a period, if shorter)."""


def _cronsim() -> Any:
    try:
        import cronsim  # noqa: PLC0415 - an extra, needed only for --cron schedules
    except ImportError:
        raise ImportError(
            "cron schedules need cronsim: pip install 'afk_local[schedule]'"
        ) from None
    return cronsim


def local_zone_name() -> str:
    """The IANA name of this machine's time zone (``$TZ``, else ``/etc/localtime``'s target).

    ``""`` when neither names a zone ``zoneinfo`` knows.
    """
    candidates = [os.environ.get("TZ", "").lstrip(":")]
    try:
        target = os.path.realpath("/etc/localtime")
    except OSError:  # pragma: no cover - realpath does not raise on Linux or macOS
        target = ""
    if "zoneinfo/" in target:
        candidates.append(target.rsplit("zoneinfo/", 1)[1])
    for name in candidates:
        if name and not name.startswith("/"):
            try:
                zoneinfo.ZoneInfo(name)
            except (zoneinfo.ZoneInfoNotFoundError, ValueError):
                continue
            return name
    return ""


def zone(name: str) -> dt.tzinfo:
    """The time zone ``name`` (IANA, e.g. ``Europe/Berlin``); ``""`` is the local one.

    The local zone is taken by its name (:func:`local_zone_name`), so its daylight
    saving rules apply at every instant: a fixed offset read once would move a
    ``--cron`` schedule by an hour across a change, and repeat the fall-back night's
    slots. Only a machine whose zone has no name gets the offset in force now (on the
    clock durable time uses).
    """
    if not name:
        local_name = local_zone_name()
        if local_name:
            return zoneinfo.ZoneInfo(local_name)
        local = dt.datetime.fromtimestamp(current_clock().time()).astimezone().tzinfo
        assert local is not None
        return local
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"unknown time zone {name!r} ({exc})") from None


def check_cron(expr: str, timezone: str = "") -> None:
    """Raise ValueError when ``expr`` is no cron expression cronsim accepts."""
    cronsim = _cronsim()
    try:
        cronsim.CronSim(expr, dt.datetime.fromtimestamp(wall_ns() / 1e9, zone(timezone)))
    except cronsim.CronSimError as exc:
        raise ValueError(f"bad cron expression {expr!r}: {exc}") from None


def _cron_iter(expr: str, timezone: str, start: float, *, reverse: bool) -> Iterator[float]:
    cronsim = _cronsim()
    when = dt.datetime.fromtimestamp(start, zone(timezone)).replace(microsecond=0)
    for found in cronsim.CronSim(expr, when, reverse=reverse):
        yield found.timestamp()


@dataclass(frozen=True)
class Timing:
    """When a schedule fires: ``every_s`` seconds, or ``cron`` in ``timezone``."""

    every_s: int = 0
    cron: str = ""
    timezone: str = ""

    def latest(self, now: float) -> float:
        """The newest slot at or before ``now``."""
        if self.every_s:
            return float(math.floor(now / self.every_s) * self.every_s)
        # reverse iteration starts strictly before its start: a second past now includes now
        return next(_cron_iter(self.cron, self.timezone, math.floor(now) + 1, reverse=True))

    def slots_after(self, after: float, now: float) -> list[float]:
        """The slots in ``(after, now]``, oldest first, at most the newest :data:`MAX_CATCHUP`."""
        if self.every_s:
            step = self.every_s
            first = math.floor(after / step) * step + step
            last = math.floor(now / step) * step
            first = max(first, last - (MAX_CATCHUP - 1) * step)
            return [float(t) for t in range(int(first), int(last) + 1, step)]
        found: list[float] = []
        for slot in _cron_iter(self.cron, self.timezone, math.floor(now) + 1, reverse=True):
            if slot <= after or len(found) >= MAX_CATCHUP:
                break
            found.append(slot)
        return found[::-1]

    def period(self, slot: float) -> float:
        """Seconds from ``slot`` to the next slot."""
        if self.every_s:
            return float(self.every_s)
        return next(_cron_iter(self.cron, self.timezone, slot, reverse=False)) - slot


def due_slots(
    timing: Timing, now: float, *, created: float, catchup: str, newest_run: float | None
) -> list[float]:
    """The slots a watcher should start at ``now`` (oldest first); runs may exist for some.

    Args:
        timing: the schedule's slots.
        now: the clock's time.
        created: when the schedule was made; earlier slots never count.
        catchup: ``latest``, ``all`` or ``skip``.
        newest_run: the newest slot that has a run already (None: none has).
    """
    latest = timing.latest(now)
    if latest < created:
        return []
    if catchup == "all":
        after = max(newest_run if newest_run is not None else -math.inf, created - 1e-9)
        return [s for s in timing.slots_after(after, now) if s >= created]
    if catchup == "skip":
        grace = min(timing.period(latest), SKIP_GRACE_S)
        return [latest] if now - latest < grace else []
    return [latest]


__all__ = [
    "CATCHUP",
    "MAX_CATCHUP",
    "OVERLAP",
    "SKIP_GRACE_S",
    "Timing",
    "check_cron",
    "due_slots",
    "local_zone_name",
    "zone",
]
