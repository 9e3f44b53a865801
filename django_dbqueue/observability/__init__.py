"""What operators watch the queue with: Prometheus metrics (:mod:`.metrics` from the
workers, :mod:`.cluster` and :mod:`.views` from the database), OpenTelemetry traces from
the enqueuing request into the job (:mod:`.tracing`) and the health check behind
``dbqueue_health`` (:mod:`.health`). docs/observability.md lists every name they emit.

Stands on ``queue/``; the worker and the commands import it. ``prometheus_client`` and
``opentelemetry`` are optional and imported only when their feature is on.
"""
