"""OpenTelemetry traces of durable runs (the ``otel`` extra: ``pip install afk_local[otel]``).

:func:`instrument` registers an observer with the runner (:mod:`afk_local.runner.observe.observe`):
from then on every attempt of an ``@afk.durable`` run in this process is a span
(``afk.attempt``), and every ``ctx.step`` a child span of it (``afk.step``), with
the run id, attempt, seq and step key as attributes. The first attempt's trace and
span ids are recorded in the run's ``run.meta`` (``extra["otel"]``), so every later
attempt (a resume after a crash, in any process that instruments) carries a span
link to the first one: a trace viewer shows the run's attempts together.

Nothing in afk_local imports this module: call :func:`instrument` where your jobs
are defined (the module, so ``afk-local resume`` and the watcher's children, which
import it, trace too). Without it the runner pays one check per step.

Example:
    >>> from afk_local.integrations import otel  # doctest: +SKIP
    >>> otel.instrument()  # the global tracer provider; or instrument(tracer_provider=tp)
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, SpanContext, Status, StatusCode, TraceFlags

from afk_local.runner.observe.observe import (
    AttemptInfo,
    AttemptObservation,
    StepInfo,
    add_observer,
    remove_observer,
)

TRACE_KEY = "otel"
"""``RunMeta.extra`` key: ``{"trace_id": hex, "span_id": hex}`` of the run's first attempt span."""
TRACER_NAME = "afk_local"


def _first_attempt(extra: Mapping[str, Any]) -> SpanContext | None:
    """The span context of the run's first traced attempt, as recorded in ``run.meta``."""
    raw = extra.get(TRACE_KEY)
    if not isinstance(raw, Mapping):
        return None
    try:
        trace_id, span_id = int(str(raw["trace_id"]), 16), int(str(raw["span_id"]), 16)
    except (KeyError, ValueError):
        return None
    if not trace_id or not span_id:
        return None
    return SpanContext(
        trace_id=trace_id,
        span_id=span_id,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )


class _AttemptSpan:
    """One attempt's span, current while the job runs; step spans are its children."""

    def __init__(self, tracer: trace.Tracer, info: AttemptInfo) -> None:
        self._tracer = tracer
        self._info = info
        first = _first_attempt(info.extra)
        links = [Link(first, {"afk.link": "first_attempt"})] if first is not None else []
        self._span = tracer.start_span(
            "afk.attempt",
            links=links,
            attributes={
                "afk.run_id": info.run_id,
                "afk.attempt": info.attempt,
                "afk.seq": info.seq,
                "afk.resumed": info.resumed,
                "afk.entrypoint": info.entrypoint or "",
            },
        )
        own = self._span.get_span_context()
        if first is not None:
            self._record = dict(info.extra[TRACE_KEY])
        else:
            self._record = {"trace_id": f"{own.trace_id:032x}", "span_id": f"{own.span_id:016x}"}
        self._token = otel_context.attach(trace.set_span_in_context(self._span))

    def meta_extra(self) -> Mapping[str, Any]:
        """The first attempt's ids (kept as they are by every later attempt)."""
        return {TRACE_KEY: self._record}

    def step(self, info: StepInfo) -> AbstractContextManager[None]:
        """A child span ``afk.step`` around one ``ctx.step``; its exception marks it an error."""
        return self._step_span(info)

    @contextmanager
    def _step_span(self, info: StepInfo) -> Iterator[None]:
        attributes: dict[str, str | int | bool] = {
            "afk.run_id": info.run_id,
            "afk.attempt": info.attempt,
            "afk.seq": info.seq,
            "afk.step": info.step,
            "afk.step.key": info.key,
            "afk.step.name": info.name,
            "afk.replayed": info.replayed,
        }
        with self._tracer.start_as_current_span(
            f"afk.step {info.name}",
            context=trace.set_span_in_context(self._span),
            attributes=attributes,
        ):
            yield

    def ended(self, status: str, error: BaseException | None) -> None:
        """End the attempt's span with its outcome (``afk.outcome``)."""
        self._span.set_attribute("afk.outcome", status)
        if status == "failed" and error is not None:
            self._span.record_exception(error)
            self._span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        try:
            otel_context.detach(self._token)
        finally:
            self._span.end()


class RunTracer:
    """The observer :func:`instrument` registers: one :class:`_AttemptSpan` per attempt."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self.tracer = tracer

    def attempt_started(self, info: AttemptInfo) -> AttemptObservation:
        """Start the attempt's span (linked to the run's first attempt, if it had one)."""
        return _AttemptSpan(self.tracer, info)


_installed: list[RunTracer] = []


def instrument(tracer_provider: trace.TracerProvider | None = None) -> RunTracer:
    """Trace every durable run attempt and step of this process from now on.

    Calling it again replaces the previous instrumentation (e.g. with another
    provider). Returns the registered observer.

    Args:
        tracer_provider: where spans go (default: the global provider).
    """
    uninstrument()
    tracer = trace.get_tracer(TRACER_NAME, tracer_provider=tracer_provider)
    observer = RunTracer(tracer)
    add_observer(observer)
    _installed.append(observer)
    return observer


def uninstrument() -> None:
    """Stop tracing runs started from now on."""
    while _installed:
        remove_observer(_installed.pop())


__all__ = ["TRACE_KEY", "RunTracer", "instrument", "uninstrument"]
