"""OpenTelemetry: enqueue() keeps the current trace on the job, and the worker runs the
job in a CONSUMER span linked to it (the SDK's in-memory exporter records them)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.test import override_settings
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from django_dbqueue import enqueue, enqueue_many
from django_dbqueue.models import Job
from django_dbqueue.observability import tracing
from django_dbqueue.worker.loop import Worker
from tests.support import jobs

pytestmark = pytest.mark.django_db(transaction=True)

_EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def _stop_exporting_afterwards() -> Iterator[None]:
    yield
    _EXPORTER.shutdown()  # later tests' spans are made, not kept


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    # The global provider can be set once per process: this module's, kept for the rest.
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    tracing.look_again()
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


def drain() -> Worker:
    worker = Worker(burst=True, handle_signals=False)
    worker.run()
    return worker


def traceparent(span: ReadableSpan) -> str:
    context = span.get_span_context()
    assert context is not None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


def test_the_job_span_is_linked_to_the_request_that_enqueued_it(
    spans: InMemorySpanExporter,
) -> None:
    tracer = trace.get_tracer("tests")
    with tracer.start_as_current_span("GET /orders", kind=SpanKind.SERVER):
        job = enqueue(jobs.add, args=[2, 3])
    # Enqueueing reads the context only: the request's span is the one span so far.
    [request] = spans.get_finished_spans()
    assert Job.objects.get(pk=job.pk).trace_context == traceparent(request)

    drain()

    [consumer] = named(spans, "default process")
    assert consumer.kind == SpanKind.CONSUMER
    [link] = consumer.links
    assert link.context.trace_id == request.context.trace_id
    assert link.context.span_id == request.context.span_id
    assert consumer.attributes is not None
    assert consumer.attributes["messaging.system"] == "django_dbqueue"
    assert consumer.attributes["messaging.operation.type"] == "process"
    assert consumer.attributes["messaging.destination.name"] == "default"
    assert consumer.attributes["messaging.message.id"] == str(job.pk)
    assert consumer.attributes["dbqueue.job.id"] == job.pk
    assert consumer.attributes["dbqueue.job.task"] == job.task
    assert consumer.attributes["dbqueue.job.attempt"] == 1
    assert consumer.status.status_code != StatusCode.ERROR


def test_a_failed_attempt_records_its_exception(spans: InMemorySpanExporter) -> None:
    job = enqueue(jobs.fail, args=["kaput"], max_attempts=1)
    drain()
    assert Job.objects.get(pk=job.pk).status == Job.Status.FAILED
    [consumer] = named(spans, "default process")
    assert consumer.status.status_code == StatusCode.ERROR
    [event] = [event for event in consumer.events if event.name == "exception"]
    assert event.attributes is not None
    assert "kaput" in str(event.attributes["exception.message"])
    # Enqueued outside any span: nothing to link to, and nothing stored.
    assert consumer.links == ()
    assert Job.objects.get(pk=job.pk).trace_context is None


def test_enqueue_many_gives_every_job_the_trace(spans: InMemorySpanExporter) -> None:
    tracer = trace.get_tracer("tests")
    with tracer.start_as_current_span("nightly import"):
        created = enqueue_many({"task": jobs.add, "args": [i, i]} for i in range(3))
    [parent] = spans.get_finished_spans()
    stored = set(Job.objects.values_list("trace_context", flat=True))
    assert stored == {traceparent(parent)}
    assert {job.trace_context for job in created} == {traceparent(parent)}


def test_tracing_off_stores_nothing_and_makes_no_span(spans: InMemorySpanExporter) -> None:
    tracer = trace.get_tracer("tests")
    with override_settings(DBQUEUE={"TRACING": False}):
        with tracer.start_as_current_span("request"):
            job = enqueue(jobs.add, args=[1, 1])
        drain()
    assert Job.objects.get(pk=job.pk).trace_context is None
    assert [span.name for span in spans.get_finished_spans()] == ["request"]


def test_a_malformed_stored_traceparent_is_ignored() -> None:
    assert tracing.parse_traceparent(trace, "00-xyz-abc-01") is None
    assert tracing.parse_traceparent(trace, "00-" + "0" * 32 + "-" + "0" * 16 + "-01") is None
    good = tracing.parse_traceparent(trace, "00-" + "a" * 32 + "-" + "b" * 16 + "-01")
    assert good is not None and good.is_remote
