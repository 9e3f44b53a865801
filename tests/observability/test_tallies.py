"""A worker process's tallies, in this process: what threads count between flushes comes
out in the metrics exactly once, in the right buckets."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

from django.utils import timezone

from django_dbqueue.models import Job
from django_dbqueue.observability import hooks
from django_dbqueue.observability.tallies import Tally, WorkerMetrics

THREADS, BATCHES, SIZE = 4, 100, 10


def values(metric: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in metric.collect()
        for sample in family.samples
    }


def value(metric: Any, name: str, **labels: str) -> float:
    return values(metric).get((name, tuple(sorted(labels.items()))), 0.0)


def child_tally() -> tuple[WorkerMetrics, Tally]:
    metrics = WorkerMetrics.create()
    tally = Tally(metrics)
    tally.write_through = False  # as in a child: flushed by another thread
    return metrics, tally


def test_threads_batches_are_flushed_once_each_while_they_count() -> None:
    metrics, tally = child_tally()
    waited = timezone.now() - timedelta(seconds=7)  # in the 10 s bucket of waits
    jobs = [Job(id=i, queue="q", task="t", run_after=waited) for i in range(SIZE)]
    start = threading.Barrier(THREADS + 1)
    stop = threading.Event()

    def count() -> None:
        start.wait()
        for _ in range(BATCHES):
            now = timezone.now()
            tally.ended(jobs, [now] * SIZE, [0.3] * SIZE, jobs)  # 0.3 s: le 0.5

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
    ended = THREADS * BATCHES * SIZE
    run, wait = metrics.run_seconds, metrics.wait_seconds
    labels = {"queue": "q", "task": "t"}
    assert value(run, "dbqueue_job_run_seconds_count", **labels) == ended
    assert value(run, "dbqueue_job_run_seconds_bucket", **labels, le="0.25") == 0
    assert value(run, "dbqueue_job_run_seconds_bucket", **labels, le="0.5") == ended
    assert abs(value(run, "dbqueue_job_run_seconds_sum", **labels) - 0.3 * ended) < 1e-6
    assert value(wait, "dbqueue_job_wait_seconds_bucket", **labels, le="5.0") == 0
    assert value(wait, "dbqueue_job_wait_seconds_bucket", **labels, le="10.0") == ended
    assert 7 * ended <= value(wait, "dbqueue_job_wait_seconds_sum", **labels) < 8 * ended
    finished = "dbqueue_jobs_finished_total"
    assert value(metrics.finished, finished, **labels, outcome="done") == ended


def test_a_batch_of_several_tasks_is_timed_per_task() -> None:
    metrics, tally = child_tally()
    now = timezone.now()
    early = now + timedelta(seconds=90)  # run_after ahead of this host's clock
    jobs = [
        Job(id=1, queue="q", task="t", run_after=now - timedelta(seconds=2)),
        Job(id=2, queue="q", task="u", run_after=now - timedelta(seconds=0.2)),
        Job(id=3, queue="q", task="t", run_after=early),
    ]
    tally.ended(jobs, [now] * 3, [0.001, 20.0, 0.02], jobs[1:])
    tally.flush()
    run, wait = metrics.run_seconds, metrics.wait_seconds
    t, u = {"queue": "q", "task": "t"}, {"queue": "q", "task": "u"}
    assert value(run, "dbqueue_job_run_seconds_count", **t) == 2
    assert abs(value(run, "dbqueue_job_run_seconds_sum", **t) - 0.021) < 1e-9
    assert value(run, "dbqueue_job_run_seconds_bucket", **t, le="0.005") == 1
    assert value(run, "dbqueue_job_run_seconds_bucket", **t, le="0.01") == 1
    assert value(run, "dbqueue_job_run_seconds_bucket", **t, le="0.025") == 2
    assert value(run, "dbqueue_job_run_seconds_count", **u) == 1
    assert value(run, "dbqueue_job_run_seconds_bucket", **u, le="10.0") == 0
    assert value(run, "dbqueue_job_run_seconds_bucket", **u, le="30.0") == 1
    # A start before run_after (a clock behind the enqueuer's) waited 0, not -90 s.
    assert value(wait, "dbqueue_job_wait_seconds_bucket", **t, le="0.01") == 1
    assert abs(value(wait, "dbqueue_job_wait_seconds_sum", **t) - 2.0) < 1e-6
    assert value(wait, "dbqueue_job_wait_seconds_bucket", **u, le="0.1") == 0
    assert value(wait, "dbqueue_job_wait_seconds_bucket", **u, le="0.25") == 1
    finished = "dbqueue_jobs_finished_total"
    assert value(metrics.finished, finished, **t, outcome="done") == 1
    assert value(metrics.finished, finished, **u, outcome="done") == 1


def test_running_jobs_are_those_the_executors_run_at_the_flush() -> None:
    metrics, tally = child_tally()
    running: list[Job] = [Job(id=1, queue="q", run_after=timezone.now())]
    running.append(Job(id=2, queue="q", run_after=timezone.now()))

    def source() -> list[Job]:
        return list(running)

    hooks.watch(source, ["q", "idle"])
    try:
        tally.flush()
        assert value(metrics.running, "dbqueue_jobs_running", queue="q") == 2
        # A queue the worker takes is shown while it runs nothing.
        assert ("dbqueue_jobs_running", (("queue", "idle"),)) in values(metrics.running)
        running[:] = [Job(id=3, queue="r", run_after=timezone.now())]
        tally.flush()
        assert value(metrics.running, "dbqueue_jobs_running", queue="q") == 0
        assert value(metrics.running, "dbqueue_jobs_running", queue="r") == 1
    finally:
        hooks.unwatch(source, ["q", "idle"])
    tally.flush()
    assert value(metrics.running, "dbqueue_jobs_running", queue="r") == 0


def test_a_batch_of_one_task_counts_its_done_jobs_only() -> None:
    """An attempt that failed is timed and not counted done; in a batch whose write
    found some jobs taken over, only those it wrote are done."""
    metrics, tally = child_tally()
    jobs = [Job(id=i, queue="q", task="t", run_after=timezone.now()) for i in range(3)]
    tally.ended(jobs[:1], [timezone.now()], [0.1], ())
    tally.ended(jobs, [timezone.now()] * 3, [0.1] * 3, jobs[1:])
    tally.flush()
    labels = {"queue": "q", "task": "t"}
    assert value(metrics.run_seconds, "dbqueue_job_run_seconds_count", **labels) == 4
    finished = "dbqueue_jobs_finished_total"
    assert value(metrics.finished, finished, **labels, outcome="done") == 2
