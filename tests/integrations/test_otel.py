"""OpenTelemetry spans of durable runs (SDK in-memory exporter), linked across a resume."""

from __future__ import annotations

from collections.abc import Iterator

import proc
import pytest
import report_jobs
from proc import SUPPORT

import afk_local as afk

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import StatusCode

from afk_local.integrations import otel

N = 6


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel.instrument(provider)
    try:
        yield exporter
    finally:
        otel.uninstrument()


def test_a_span_per_attempt_and_step_linked_across_a_resume(
    afk_store: afk.Store, spans: InMemorySpanExporter
) -> None:
    job = report_jobs.metered.with_store(afk_store)
    report_jobs.FAIL_AT[:] = [3]
    with pytest.raises(ValueError):
        job.run(N, run_id="t")
    assert job.run(run_id="t") == sum(i * i for i in range(N))

    finished = spans.get_finished_spans()
    attempts = [s for s in finished if s.name == "afk.attempt"]
    assert [s.attributes["afk.attempt"] for s in attempts] == [1, 2]
    first, second = attempts
    assert first.attributes["afk.outcome"] == "failed"
    assert first.status.status_code is StatusCode.ERROR
    assert second.attributes["afk.outcome"] == "completed" and second.attributes["afk.resumed"]
    # the resumed attempt links to the first, whose ids run.meta keeps
    assert [link.context.span_id for link in second.links] == [first.context.span_id]
    assert second.links[0].context.trace_id == first.context.trace_id
    recorded = afk_store.read_meta("t").extra[otel.TRACE_KEY]
    assert int(recorded["trace_id"], 16) == first.context.trace_id
    assert int(recorded["span_id"], 16) == first.context.span_id

    steps = [s for s in finished if s.name.startswith("afk.step")]
    for step in steps:
        parent = first if step.attributes["afk.attempt"] == 1 else second
        assert step.parent is not None and step.parent.span_id == parent.context.span_id
        assert step.attributes["afk.run_id"] == "t"
        # the checkpoint it follows: none yet (0) for a new run's first steps, which have
        # no run_started before them; the resumed attempt's run_started at least
        assert step.attributes["afk.seq"] >= (1 if parent is second else 0)
    seqs = [s.attributes["afk.seq"] for s in steps if s.attributes["afk.attempt"] == 1]
    assert seqs == sorted(seqs) and seqs[0] == 0 and seqs[-1] >= 1
    keys = [s.attributes["afk.step.key"] for s in steps if s.attributes["afk.attempt"] == 2]
    assert keys[0] == "iterate#1[3]/square#1"  # the resume starts at the unfinished item
    flaky = [s for s in steps if s.name == "afk.step flaky"]
    assert flaky[0].status.status_code is StatusCode.ERROR
    assert [s.attributes["afk.step"] for s in steps if s.name == "afk.step square"] == [
        1,
        2,
        3,
        5,
        6,
        7,
    ]


KILLED = """
import sys
from opentelemetry.sdk.trace import TracerProvider
from afk_local.integrations import otel
otel.instrument(TracerProvider())
import report_jobs
import afk_local as afk
report_jobs.metered.with_store(afk.Store(sys.argv[1])).run(int(sys.argv[2]), run_id="k")
"""


def test_an_attempt_in_a_new_process_links_to_the_killed_first_one(
    tmp_path, spans: InMemorySpanExporter
) -> None:
    root = tmp_path / "store"
    env = {"PYTHONPATH": str(SUPPORT), "REPORT_JOBS_ACK": "1"}
    killed = proc.kill_after(proc.spawn(KILLED, str(root), str(N), env=env), acks=2)
    assert killed.returncode == -9, killed.stderr
    store = afk.Store(root)
    recorded = store.read_meta("k").extra[otel.TRACE_KEY]  # the dead attempt's trace

    report_jobs.metered.with_store(store).run(run_id="k")
    (attempt,) = [s for s in spans.get_finished_spans() if s.name == "afk.attempt"]
    assert attempt.attributes["afk.attempt"] == 2
    (link,) = attempt.links
    assert link.context.trace_id == int(recorded["trace_id"], 16)
    assert link.context.span_id == int(recorded["span_id"], 16)
    assert store.read_meta("k").extra[otel.TRACE_KEY] == recorded  # the first one stays


def test_the_core_never_imports_opentelemetry(tmp_path) -> None:
    script = """
import sys
import afk_local as afk
import afk_local.cli.main
import report_jobs
report_jobs.metered.with_store(afk.Store(sys.argv[1])).run(3, run_id="plain")
loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
assert not loaded, loaded
print("ok")
"""
    done = proc.run(script, str(tmp_path / "s"), env={"PYTHONPATH": str(SUPPORT)})
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_uninstrument_stops_tracing(afk_store: afk.Store, spans: InMemorySpanExporter) -> None:
    otel.uninstrument()
    report_jobs.metered.with_store(afk_store).run(2, run_id="quiet")
    assert spans.get_finished_spans() == ()
    assert otel.TRACE_KEY not in afk_store.read_meta("quiet").extra
