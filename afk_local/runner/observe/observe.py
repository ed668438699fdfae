"""Observers of durable runs: the seam tracing integrations plug into.

The runner calls every registered :class:`RunObserver` when an attempt of a
``@afk.durable`` run starts and ends, and around each ``ctx.step``. With none
registered (the default) this costs one truthiness check per step. The core
never imports an observer: an integration registers itself, e.g.
``afk_local.integrations.otel.instrument()`` (docs/runner.md, "Tracing").

An observer may ask for entries in the run's ``run.meta`` ``extra`` (the
OpenTelemetry one records its trace there, so a later attempt can link to the
first); they are written with the attempt's own meta update, no extra write.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class AttemptInfo:
    """One attempt of a durable run, as an observer sees it when it starts."""

    run_id: str
    attempt: int
    entrypoint: str | None
    resumed: bool
    seq: int
    """The run's newest checkpoint seq when the attempt starts."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """The run's ``run.meta`` ``extra`` as recorded before this attempt."""


@dataclass(frozen=True)
class StepInfo:
    """One ``ctx.step`` call, as an observer sees it."""

    run_id: str
    attempt: int
    key: str
    name: str
    step: int
    """The run's logical step number of the call."""
    seq: int
    """The newest checkpoint seq written when the call starts."""
    replayed: bool
    """True when its recorded outcome is returned and ``fn`` is not called."""


class AttemptObservation(Protocol):
    """What an observer keeps for one attempt (returned by :meth:`RunObserver.attempt_started`)."""

    def meta_extra(self) -> Mapping[str, Any]:
        """Entries to record in the run's ``run.meta`` ``extra`` (may be empty)."""

    def step(self, info: StepInfo) -> AbstractContextManager[None]:
        """A context around one ``ctx.step`` call; an exception passes through it."""

    def ended(self, status: str, error: BaseException | None) -> None:
        """The attempt ended: ``completed``, ``failed``, ``paused`` or ``stopped``."""


class RunObserver(Protocol):
    """Something told about every attempt of every durable run in this process."""

    def attempt_started(self, info: AttemptInfo) -> AttemptObservation:
        """An attempt starts (before its job function is called)."""


class _Registry:
    """The registered observers: a tuple replaced whole, so readers never need the lock."""

    lock = threading.Lock()
    observers: tuple[RunObserver, ...] = ()


def add_observer(observer: RunObserver) -> Callable[[], None]:
    """Register ``observer`` for the attempts that start from now on; returns its remover."""
    with _Registry.lock:
        _Registry.observers = (*_Registry.observers, observer)

    def remove() -> None:
        remove_observer(observer)

    return remove


def remove_observer(observer: RunObserver) -> None:
    """Unregister ``observer`` (attempts already running keep reporting to it)."""
    with _Registry.lock:
        _Registry.observers = tuple(o for o in _Registry.observers if o is not observer)


def observers() -> tuple[RunObserver, ...]:
    """The registered observers (an empty tuple, usually)."""
    return _Registry.observers


__all__ = [
    "AttemptInfo",
    "AttemptObservation",
    "RunObserver",
    "StepInfo",
    "add_observer",
    "observers",
    "remove_observer",
]
