"""The pickup latency under a steady load (``dbqueue_bench --only steady``).

A producer process enqueues no-op jobs one at a time at a fixed rate (``--rate``, 500
jobs/s by default) for a fixed time (``--seconds``) while ``--workers`` worker processes
(a supervisor, as ``run_jobs`` starts them, not in burst mode) drain them. Each job's
start minus its creation, both times of the database's clock, is its pickup latency;
the report gives their p50 and p99 and the rate the producer achieved. The supervisor
stops when its workers have run every produced job (``--max-jobs``), and every job must
have run exactly once.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import statistics
import time
import traceback
from collections.abc import Callable
from functools import partial
from typing import Any

from django.db import connections, router

from django_dbqueue.bench.runs import noop, wait_for_purge, warm_up
from django_dbqueue.enqueueing import enqueue
from django_dbqueue.models import Job
from django_dbqueue.queue import clock
from django_dbqueue.worker.supervisor import Supervisor

# Beyond the production time, how long the workers may take to finish before the
# benchmark gives up on them (a stuck run fails; it is never a figure).
FINISH_TIMEOUT = 120.0


def _child(work: Callable[[], None]) -> None:
    """A forked process's body: ``work``, then exit 0, or 1 with its traceback printed."""
    code = 1
    try:
        work()
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        connections.close_all()
        os._exit(code)


def _produce(total: int, rate: float, queue: str, start: Any, seconds_taken: Any) -> None:
    """The producer: ``total`` enqueues, the n-th due ``n / rate`` seconds after the
    start; one that fell behind sends back to back until it is on time again."""
    clock.queue_now()  # connected, and the clock read, before the start
    start.wait()
    began = time.perf_counter()
    for index in range(total):
        delay = began + index / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        enqueue(noop, queue=queue)
    seconds_taken.value = time.perf_counter() - began


def _supervise(workers: int, options: dict[str, Any]) -> None:
    """The workers: a supervisor as ``run_jobs --max-jobs`` starts it."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # until run() sets its own
    Supervisor(workers, options).run()


def _stop(process: Any) -> None:
    if process.is_alive() and process.pid:
        os.kill(process.pid, signal.SIGTERM)
        process.join(30)
        if process.is_alive():
            process.kill()
            process.join()


def bench_steady(
    rate: int, seconds: int, workers: int, batch_size: int | None, queue: str
) -> dict[str, float]:
    """Produce ``rate`` jobs/s for ``seconds`` while ``workers`` processes drain;
    returns the pickup latency's p50 and p99 (ms) and the production rate achieved."""
    using = router.db_for_write(Job)
    total = rate * seconds
    wait_for_purge(using)
    warm_up()
    connections.close_all()  # neither child inherits an open socket
    ctx = multiprocessing.get_context("fork")
    start, taken = ctx.Event(), ctx.Value("d", 0.0)
    options = {"max_jobs": total, "batch_size": batch_size, "queues": [queue]}
    supervisor = ctx.Process(target=_child, args=(partial(_supervise, workers, options),))
    produce = partial(_produce, total, float(rate), queue, start, taken)
    producer = ctx.Process(target=_child, args=(produce,))
    supervisor.start()
    producer.start()
    try:
        time.sleep(1.0)  # the workers started and idle, the producer connected
        start.set()
        producer.join(seconds * 10 + FINISH_TIMEOUT)
        if producer.exitcode != 0:
            raise RuntimeError(f"the steady producer failed (exit code {producer.exitcode})")
        supervisor.join(FINISH_TIMEOUT)
        if supervisor.exitcode != 0:
            raise RuntimeError(f"the steady workers did not finish (exit {supervisor.exitcode})")
    finally:
        _stop(producer)
        _stop(supervisor)
    return _figures(using, total, queue, taken.value)


def _figures(using: str, total: int, queue: str, seconds_taken: float) -> dict[str, float]:
    rows = (
        Job.objects.using(using)
        .filter(queue=queue, status=Job.Status.DONE, attempts=1, started_at__isnull=False)
        .values_list("created_at", "started_at")
    )
    latencies = sorted(
        (started - created).total_seconds() * 1000
        for created, started in rows
        if started is not None  # (none is: the filter says so)
    )
    if len(latencies) != total or Job.objects.using(using).count() != total:
        raise RuntimeError(f"steady run: {len(latencies)} of {total} jobs ran, once each")
    cuts = statistics.quantiles(latencies, n=100, method="inclusive")
    return {
        "steady_pickup_p50_ms": statistics.median(latencies),
        "steady_pickup_p99_ms": cuts[98],
        "steady_rate_per_s": total / seconds_taken,
    }
