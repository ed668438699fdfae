"""``ctx.tags``: a run's tags, kept in its ``run.meta`` (``extra["tags"]``).

Tags are short strings people filter runs by (``afk-local runs --tag model=small``).
They are set when a run starts (``job.run(..., tags={...})``) or by the job
(``ctx.tags["model"] = "small"``); every change rewrites ``run.meta`` once (an
atomic write), so set tags, do not count with them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

from afk_local.runner.writer import DurableWriter
from afk_local.storage.views.run_info import TAGS_KEY, tags_of

MAX_TAG_CHARS = 256
SCHEDULE_TAG_KEY = "schedule"
"""The tag naming the schedule whose watcher made the run (``afk-local schedule add``)."""
SLOT_TAG_KEY = "schedule.slot"
"""The tag holding the slot a scheduled run is for (UTC, ISO 8601): ``ctx.scheduled_slot``."""


def checked_tags(tags: Mapping[Any, Any] | None) -> dict[str, str]:
    """``tags`` as ``{str: str}``; refuses other types, empty keys and over-long strings.

    Raises:
        TypeError: a key or value that is not a string.
        ValueError: an empty key, or a key or value over 256 characters.
    """
    result: dict[str, str] = {}
    for key, value in (tags or {}).items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"tags are str -> str, not {key!r}: {value!r}")
        if not key or len(key) > MAX_TAG_CHARS or len(value) > MAX_TAG_CHARS:
            raise ValueError(f"a tag key is 1-{MAX_TAG_CHARS} characters, a value at most that")
        result[key] = value
    return result


class RunTags(MutableMapping[str, str]):
    """The tags of a running run; each change is written to ``run.meta`` at once."""

    def __init__(self, writer: DurableWriter) -> None:
        self._writer = writer
        self._tags = tags_of(writer.run.meta.extra)

    def __getitem__(self, key: str) -> str:
        return self._tags[key]

    def __setitem__(self, key: str, value: str) -> None:
        checked_tags({key: value})
        if self._tags.get(key) != value:
            self._write({**self._tags, key: value})

    def __delitem__(self, key: str) -> None:
        if key not in self._tags:
            raise KeyError(key)
        self._write({k: v for k, v in self._tags.items() if k != key})

    def __iter__(self) -> Iterator[str]:
        return iter(self._tags)

    def __len__(self) -> int:
        return len(self._tags)

    def __repr__(self) -> str:
        return f"RunTags({self._tags!r})"

    def update_all(self, tags: Mapping[str, str]) -> None:
        """Set several tags with one write."""
        merged = {**self._tags, **checked_tags(tags)}
        if merged != self._tags:
            self._write(merged)

    def _write(self, tags: dict[str, str]) -> None:
        extra = dict(self._writer.run.meta.extra)
        extra[TAGS_KEY] = tags
        self._writer.update_meta(extra=extra)
        self._tags = tags


__all__ = ["SCHEDULE_TAG_KEY", "SLOT_TAG_KEY", "RunTags", "checked_tags"]
