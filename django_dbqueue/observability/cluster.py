"""The whole cluster's Prometheus metrics, read from the database.

Jobs by queue and status, the age of each queue's oldest due job (the lag to alert on),
paused queues and live worker processes: the dashboard's bounded queries
(:mod:`django_dbqueue.queue.counts`), a handful of statements whatever the number of
queues, and the text rendered once per ``METRICS_CACHE_SECONDS`` per process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from datetime import datetime

from django.db import router
from django.db.models import Count
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from django_dbqueue.conf import settings
from django_dbqueue.models import Job, WorkerProcess
from django_dbqueue.queue import clock, counts
from django_dbqueue.queue.leases import alive_since
from django_dbqueue.queue.pausing import paused_queues

STATUSES: tuple[str, ...] = tuple(Job.Status.values)


def families(now: datetime) -> list[Metric]:
    """The cluster's metric families as of ``now``."""
    using = router.db_for_write(Job)
    queues = list(settings.QUEUES)
    limit = int(settings.METRICS_COUNT_LIMIT)
    jobs = GaugeMetricFamily(
        "dbqueue_queue_jobs",
        f"Jobs by queue and status (a count stops at {limit + 1}: METRICS_COUNT_LIMIT).",
        labels=["queue", "status"],
    )
    for (queue, status), count in sorted(
        counts.capped_counts(Job, using, queues, STATUSES, limit).items()
    ):
        jobs.add_metric([queue, status], min(count, limit + 1))
    lag = GaugeMetricFamily(
        "dbqueue_queue_lag_seconds",
        "Age of the oldest due job of each queue (since its run_after); 0 when none is due.",
        labels=["queue"],
    )
    oldest = counts.oldest_runnable(Job, using, queues, now)
    for queue in queues:
        seconds = (now - oldest[queue][1]).total_seconds() if queue in oldest else 0.0
        lag.add_metric([queue], max(0.0, seconds))
    paused = GaugeMetricFamily(
        "dbqueue_queue_paused", "1 while a queue is paused, else 0.", labels=["queue"]
    )
    stopped = paused_queues()
    for queue in queues:
        paused.add_metric([queue], 1.0 if queue in stopped else 0.0)
    return [jobs, lag, paused, _workers(using, now)]


def _workers(using: str, now: datetime) -> Metric:
    family = GaugeMetricFamily(
        "dbqueue_worker_processes",
        "Live worker processes (heartbeat younger than LEASE_TIMEOUT), by host and role.",
        labels=["host", "role"],
    )
    rows = (
        WorkerProcess.objects.using(using)
        .filter(heartbeat_at__gt=alive_since(now))
        .values_list("host", "role")
        .annotate(n=Count("id"))
        .order_by("host", "role")
    )
    for host, role, n in rows:
        family.add_metric([host, role], float(n))
    return family


class ClusterCollector(Collector):
    def collect(self) -> Iterable[Metric]:
        return families(clock.queue_now())


class Cache:
    """The exposition text, rendered again once it is older than METRICS_CACHE_SECONDS
    (one render at a time: concurrent scrapes wait for it rather than query too)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(ClusterCollector())
        self.lock = threading.Lock()
        self.text = b""
        self.rendered_at: float | None = None

    def get(self) -> bytes:
        with self.lock:
            age = float(settings.METRICS_CACHE_SECONDS)
            now = time.monotonic()
            if self.rendered_at is None or now - self.rendered_at >= age:
                self.text = generate_latest(self.registry)
                self.rendered_at = now
            return self.text

    def clear(self) -> None:
        with self.lock:
            self.rendered_at = None


cache = Cache()
