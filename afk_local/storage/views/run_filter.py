"""Which runs a listing shows: status, recent activity, name glob, tags (``afk-local runs``).

:class:`RunFilter` decides on a run's ``run.meta`` first (cheap: one small file)
and on its :class:`~afk_local.RunInfo` after, so a listing reads the checkpoints
only of the runs it keeps. :func:`parse_since` and :func:`parse_tag` turn the
command line's ``--since 2h`` and ``--tag K=V`` into filter values.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone

from afk_local.storage.format.records import RunMeta, RunStatus
from afk_local.storage.views.run_info import RunInfo, tags_of

LIVENESS = ("interrupted", "live")
"""Statuses a filter accepts besides :class:`RunStatus`, for a run whose status expects an
owner (``created``, ``running``): nobody holds its lock (a crash left it) / a process does."""

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_AGO = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")


@dataclass(frozen=True)
class RunFilter:
    """What a run must be like to be listed; every given criterion must hold.

    Attributes:
        status: a :class:`RunStatus` value, or ``"interrupted"`` / ``"live"``.
        since_ms: updated at or after this wall-clock millisecond stamp.
        name: a glob (``crawl-*``) matched against the run id, the job's name
            (``count_job``) and its entrypoint (``jobs:count_job``).
        tags: each key must be tagged with that value (None: tagged at all).
    """

    status: str | None = None
    since_ms: int | None = None
    name: str | None = None
    tags: Mapping[str, str | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status is not None and self.status not in LIVENESS:
            object.__setattr__(self, "status", RunStatus(self.status).value)

    @property
    def needs_meta(self) -> bool:
        """Some criterion is decided from ``run.meta`` (a status, a name, tags)."""
        return self.status not in (None, *LIVENESS) or self.name is not None or bool(self.tags)

    @property
    def meta_status(self) -> str | None:
        """The :class:`RunStatus` value a run's meta must have, or None (any status)."""
        return None if self.status in (None, *LIVENESS) else self.status

    @property
    def needs_info(self) -> bool:
        """Some criterion needs the run's :class:`RunInfo` (liveness, last update)."""
        return self.status in LIVENESS or self.since_ms is not None

    def admits_meta(self, meta: RunMeta) -> bool:
        """What can be told from ``run.meta`` alone (the status, name and tags)."""
        if self.status not in (None, *LIVENESS) and meta.status.value != self.status:
            return False
        if self.name is not None and not self._name_matches(meta):
            return False
        tags = tags_of(meta.extra)
        for key, value in self.tags.items():
            if key not in tags or (value is not None and tags[key] != value):
                return False
        return True

    def admits(self, info: RunInfo) -> bool:
        """The rest, once the run's :class:`RunInfo` is known (liveness, last update)."""
        if self.status == "interrupted" and not info.interrupted:
            return False
        if self.status == "live" and not (info.owner_alive and info.status.expects_owner):
            return False  # a paused or finished run's lock is held only as its process ends
        return self.since_ms is None or info.updated_ms >= self.since_ms

    def _name_matches(self, meta: RunMeta) -> bool:
        assert self.name is not None
        names = [meta.run_id]
        if meta.entrypoint:
            names += [meta.entrypoint, meta.entrypoint.rpartition(":")[2]]
        return any(fnmatch.fnmatchcase(n, self.name) for n in names)


def parse_duration(text: str) -> float | None:
    """``90s``, ``30m``, ``2h``, ``1d12h``, ``1w`` as seconds; None when ``text`` is no duration."""
    compact = text.strip().lower().replace(" ", "")
    if compact and not _AGO.sub("", compact):  # only <number><unit> parts
        return sum(float(n) * _UNITS[u] for n, u in _AGO.findall(compact))
    return None


def parse_since(text: str, now_ms: int) -> int:
    """``2h``, ``30m``, ``1d12h``, ``1w`` ago, or an ISO date/time, as a millisecond stamp.

    Raises:
        ValueError: saying what forms are understood.
    """
    seconds = parse_duration(text)
    if seconds is not None:
        return now_ms - int(seconds * 1000)
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"--since takes an age like 30m, 2h, 3d, 1w (units s m h d w) or a date/time like "
            f"2026-11-21 or 2026-11-21T13:00, not {text!r}"
        ) from None
    if when.tzinfo is None:
        when = when.astimezone()  # local time, as a person means it
    return int(when.astimezone(timezone.utc).timestamp() * 1000)


def parse_tag(text: str) -> tuple[str, str | None]:
    """``K=V`` -> ``(K, V)``; ``K`` -> ``(K, None)`` (tagged with any value)."""
    key, sep, value = text.partition("=")
    if not key:
        raise ValueError(f"a tag filter is KEY=VALUE or KEY, not {text!r}")
    return key, (value if sep else None)


__all__ = ["LIVENESS", "RunFilter", "parse_duration", "parse_since", "parse_tag"]
