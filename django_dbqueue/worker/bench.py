"""The benchmark behind ``manage.py dbqueue_bench``: no-op jobs on the configured database."""

from __future__ import annotations

import multiprocessing
import os
import platform
import signal
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.db import connections, router, transaction
from django.utils import timezone

from django_dbqueue.enqueueing import enqueue, enqueue_many, new_job
from django_dbqueue.models import Job
from django_dbqueue.registry import job
from django_dbqueue.worker.loop import Worker
from django_dbqueue.worker.supervisor import Supervisor

BENCH_QUEUE_NOTE = "dbqueue_bench"


# Registered when the benchmark is imported: its workers are forked from it.
@job
def noop() -> None:
    """The benchmark's job: nothing, so the queue's own cost is what gets measured."""


@job
def sleep_ms(ms: float) -> None:
    """A job of a given duration (``--job-ms``): what a worker does between claims."""
    time.sleep(ms / 1000)


def machine(using: str) -> dict[str, Any]:
    """Where the figures come from, so figures of different machines are not compared blindly."""
    import django

    conn = connections[using]
    with conn.cursor() as cursor:
        if conn.vendor == "sqlite":
            cursor.execute("SELECT sqlite_version()")
        elif conn.vendor == "postgresql":
            cursor.execute("SHOW server_version")
        else:
            cursor.execute("SELECT VERSION()")
        server = str(cursor.fetchone()[0])
    return {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "django": django.get_version(),
        "database": conn.vendor,
        "database_version": server,
        "platform": platform.platform(),
    }


@dataclass
class Results:
    vendor: str
    workers: int
    figures: dict[str, float] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)


def _rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("inf")


def clear_jobs() -> None:
    Job.objects.all().delete()


def bench_enqueue_single(count: int) -> float:
    started = time.perf_counter()
    for _ in range(count):
        enqueue(noop)
    return _rate(count, time.perf_counter() - started)


def bench_enqueue_single_atomic(count: int) -> float:
    """Each enqueue in its own ``transaction.atomic()``, as in a view under ATOMIC_REQUESTS."""
    using = router.db_for_write(Job)
    started = time.perf_counter()
    for _ in range(count):
        with transaction.atomic(using=using):
            enqueue(noop)
    return _rate(count, time.perf_counter() - started)


def bench_enqueue_bulk(count: int) -> float:
    started = time.perf_counter()
    enqueue_many({"task": noop} for _ in range(count))
    return _rate(count, time.perf_counter() - started)


def bench_drain(
    count: int,
    workers: int,
    batch_size: int | None,
    job_ms: float = 0,
    keys: int = 0,
    key_limit: int = 1,
    threads: int = 1,
) -> float:
    """Enqueue ``count`` jobs (no-op, or sleeping ``job_ms``), then time ``workers``
    processes of ``threads`` threads draining them. ``keys``: the jobs take turns over
    that many concurrency keys, at most ``key_limit`` of each running at once
    (docs/concurrency.md)."""

    def spec(n: int) -> dict[str, Any]:
        one: dict[str, Any] = {"task": sleep_ms, "args": [job_ms]} if job_ms else {"task": noop}
        if keys:
            one.update(concurrency_key=f"bench:{n % keys}", concurrency_limit=key_limit)
        return one

    enqueue_many(spec(n) for n in range(count))
    options: dict[str, Any] = {"burst": True, "batch_size": batch_size, "threads": threads}
    started = time.perf_counter()
    stats = Supervisor(workers, options).run()
    elapsed = time.perf_counter() - started
    left = Job.objects.filter(status=Job.Status.QUEUED).count()
    if left or stats.done != count:
        raise RuntimeError(f"drain incomplete: {stats.done} done, {left} left of {count}")
    return _rate(count, elapsed)


def _idle_worker(ready: Any) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    worker = Worker(handle_signals=True)
    ready.set()
    worker.run()
    connections.close_all()
    os._exit(0)


def bench_latency(samples: int) -> dict[str, float]:
    """Enqueue one job at a time into an idle queue; enqueue-to-start time percentiles."""
    ctx = multiprocessing.get_context("fork")
    connections.close_all()
    ready = ctx.Event()
    process = ctx.Process(target=_idle_worker, args=(ready,), daemon=True)
    process.start()
    ready.wait(30)
    time.sleep(1.0)  # let the worker register and go idle
    latencies: list[float] = []
    try:
        for index in range(samples):
            job = enqueue(noop)
            deadline = time.monotonic() + 30
            while True:
                row = (
                    Job.objects.filter(pk=job.pk, status=Job.Status.DONE)
                    .values_list("created_at", "started_at")
                    .first()
                )
                started = row[1] if row is not None else None
                if row is not None and started is not None:
                    latencies.append((started - row[0]).total_seconds() * 1000)
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("a latency sample was not picked up within 30 s")
                time.sleep(0.002)
            # Idle gaps of varying length, so samples do not line up with the poll cycle.
            time.sleep(0.05 + (index % 7) * 0.03)
    finally:
        if process.pid:
            os.kill(process.pid, signal.SIGTERM)
        process.join(30)
    cuts = statistics.quantiles(latencies, n=100, method="inclusive")
    return {"p50": statistics.median(latencies), "p90": cuts[89], "p99": cuts[98]}


def fill_history(rows: int, report: Callable[[str], None]) -> float:
    """Insert ``rows`` finished jobs, as a busy site has after a while."""
    using = router.db_for_write(Job)
    now = timezone.now()
    chunk = 5000
    started = time.perf_counter()
    done = 0
    while done < rows:
        size = min(chunk, rows - done)
        batch = [
            new_job(
                {
                    "task": "django_dbqueue.worker.bench.noop",
                    "status": Job.Status.DONE,
                    "owner": "bench-history",
                    "created_at": now - timedelta(seconds=rows - done - i),
                    "run_after": now,
                    "finished_at": now,
                    "attempts": 1,
                    "errors": [],
                }
            )
            for i in range(size)
        ]
        with transaction.atomic(using=using):
            Job.objects.db_manager(using).insert_many(batch)
        done += size
        if done % 100_000 == 0 or done == rows:
            report(f"  history: {done:,} finished rows inserted")
    if connections[using].vendor == "postgresql":
        with connections[using].cursor() as cursor:
            cursor.execute("ANALYZE dbqueue_job")
    elif connections[using].vendor == "mysql":
        with connections[using].cursor() as cursor:
            cursor.execute("ANALYZE TABLE dbqueue_job")
            cursor.fetchall()
    return time.perf_counter() - started
