"""A worker process's tallies, in this process: what threads count between flushes comes
out in the metrics exactly once, in the right buckets."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

from django.utils import timezone

from django_dbqueue.models import Job
from django_dbqueue.observability.tallies import Tally, WorkerMetrics

THREADS, JOBS = 4, 500


def values(metric: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in metric.collect()
        for sample in family.samples
    }


def value(metric: Any, name: str, **labels: str) -> float:
    return values(metric).get((name, tuple(sorted(labels.items()))), 0.0)


def test_threads_counts_are_flushed_once_each_while_they_count() -> None:
    metrics = WorkerMetrics.create()
    tally = Tally(metrics)
    tally.write_through = False  # as in a child: flushed by another thread
    waited = timezone.now() - timedelta(seconds=7)  # in the 10 s bucket of waits
    jobs = [Job(id=i, queue="q", task="t", run_after=waited) for i in range(JOBS)]
    start = threading.Barrier(THREADS + 1)
    stop = threading.Event()

    def count() -> None:
        start.wait()
        for job in jobs:
            began = tally.began(job)
            tally.ended(job, began - 0.3, deferred=job.id % 100 == 0)  # 0.3 s: le 0.5

    def flush_often() -> None:
        while not stop.is_set():
            tally.flush()

    workers = [threading.Thread(target=count) for _ in range(THREADS)]
    flusher = threading.Thread(target=flush_often)
    for thread in [*workers, flusher]:
        thread.start()
    start.wait()
    for thread in workers:
        thread.join()
    stop.set()
    flusher.join()
    tally.flush()
    tally.flush()  # a flush with nothing new adds nothing
    ended = THREADS * JOBS
    run, wait = metrics.run_seconds, metrics.wait_seconds
    assert value(run, "dbqueue_job_run_seconds_count", queue="q", task="t") == ended
    assert value(run, "dbqueue_job_run_seconds_bucket", queue="q", task="t", le="0.25") == 0
    assert value(run, "dbqueue_job_run_seconds_bucket", queue="q", task="t", le="0.5") == ended
    assert 0.3 * ended <= value(run, "dbqueue_job_run_seconds_sum", queue="q", task="t")
    assert value(run, "dbqueue_job_run_seconds_sum", queue="q", task="t") < 0.31 * ended
    assert value(wait, "dbqueue_job_wait_seconds_bucket", queue="q", task="t", le="5.0") == 0
    assert value(wait, "dbqueue_job_wait_seconds_bucket", queue="q", task="t", le="10.0") == ended
    outcome = "dbqueue_jobs_finished_total"
    assert value(metrics.finished, outcome, queue="q", task="t", outcome="retried") == THREADS * 5
    assert value(metrics.running, "dbqueue_jobs_running", queue="q") == 0


def test_a_job_running_is_counted_until_it_ends_and_done_batches_by_task() -> None:
    metrics = WorkerMetrics.create()
    tally = Tally(metrics)
    tally.write_through = False
    job = Job(id=1, queue="q", task="t", run_after=timezone.now())
    began = tally.began(job)
    tally.flush()
    assert value(metrics.running, "dbqueue_jobs_running", queue="q") == 1
    tally.ended(job, began, deferred=False)
    other = Job(id=2, queue="q", task="u", run_after=timezone.now())
    tally.done([job, job, other])
    tally.flush()
    assert value(metrics.running, "dbqueue_jobs_running", queue="q") == 0
    outcome = "dbqueue_jobs_finished_total"
    assert value(metrics.finished, outcome, queue="q", task="t", outcome="done") == 2
    assert value(metrics.finished, outcome, queue="q", task="u", outcome="done") == 1
