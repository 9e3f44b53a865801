"""OpenTelemetry traces from the request into the job, through ``opentelemetry-api``.

``enqueue()`` reads the current span's context (no span is created there) and keeps it on
the job as a W3C ``traceparent``; the worker runs the job in a CONSUMER span named
``<queue> process`` (the messaging semantic conventions) linked to it, with the job's id,
task, queue and attempt as attributes and the exception of a failed attempt recorded.

The API is imported on first use, and only when ``DBQUEUE["TRACING"]`` is on (the
default): without it installed, or with tracing off, nothing is imported and each call
costs one cached lookup.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import TYPE_CHECKING, Any

from django_dbqueue.conf import PerSettings, settings

if TYPE_CHECKING:
    from django_dbqueue.models import Job

# Names the worker's spans use (docs/observability.md lists them; a test compares).
SPAN_SUFFIX = " process"  # the span of a job of queue "emails" is "emails process"
TRACER_NAME = "django_dbqueue"
MESSAGING_SYSTEM = "django_dbqueue"

_api: list[ModuleType | None] = []  # [opentelemetry.trace] or [None], once looked for


def _trace_api() -> ModuleType | None:
    """``opentelemetry.trace``, or None when it is not installed (looked for once)."""
    if not _api:
        try:
            _api.append(importlib.import_module("opentelemetry.trace"))
        except ImportError:
            _api.append(None)
    return _api[0]


def _enabled() -> ModuleType | None:
    return _trace_api() if settings.TRACING else None


# Read on every enqueue and every job: one comparison while the settings stay the same.
api = PerSettings(_enabled)


# Whether a tracer provider was seen set, and when to look again while none is: asking
# costs an environment lookup, and a provider, once set, stays (the API sets one once).
_provider = {"set": False, "look_at": 0.0}
LOOK_INTERVAL = 1.0


def recording() -> ModuleType | None:
    """``opentelemetry.trace`` when spans would be recorded: tracing on and a tracer
    provider set (an SDK configured). With the API alone every span is a no-op, and the
    worker skips making one. A provider set later is seen within ``LOOK_INTERVAL``."""
    trace = api()
    if trace is None:
        return None
    if _provider["set"]:
        return trace
    now = time.monotonic()
    if now < _provider["look_at"]:
        return None
    _provider["look_at"] = now + LOOK_INTERVAL
    provider = trace.get_tracer_provider()
    if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        return None
    _provider["set"] = True
    return trace


def look_again() -> None:
    """Look for a tracer provider at the next job (for code that has just set one)."""
    _provider["look_at"] = 0.0


def current_traceparent() -> str | None:
    """The W3C ``traceparent`` of the current span, or None (no valid span, tracing off)."""
    trace = api()
    if trace is None:
        return None
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def parse_traceparent(trace: ModuleType, value: str | None) -> Any:
    """The remote SpanContext a stored ``traceparent`` names, or None if it is malformed
    (the column is ours, but a row may have been written by hand)."""
    if not value:
        return None
    parts = value.split("-")
    if len(parts) != 4 or parts[0] != "00" or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    try:
        trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3], 16)
    except ValueError:
        return None
    context = trace.SpanContext(
        trace_id, span_id, is_remote=True, trace_flags=trace.TraceFlags(flags & 0xFF)
    )
    return context if context.is_valid else None


@contextmanager
def job_span(job: Job) -> Iterator[None]:
    """Run the block in the job's CONSUMER span, linked to the span that enqueued it.

    An exception leaving the block is recorded on the span (status ERROR) and re-raised.
    Without tracing, the block just runs.
    """
    trace = recording()
    if trace is None:
        yield
        return
    origin = parse_traceparent(trace, job.trace_context)
    tracer = trace.get_tracer(TRACER_NAME)
    attributes = {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": job.queue,
        "messaging.message.id": str(job.id),
        "dbqueue.job.id": job.id,
        "dbqueue.job.task": job.task,
        "dbqueue.job.attempt": job.attempts,
    }
    with tracer.start_as_current_span(
        f"{job.queue}{SPAN_SUFFIX}",
        kind=trace.SpanKind.CONSUMER,
        links=[trace.Link(origin)] if origin is not None else None,
        attributes=attributes,
    ):
        yield
