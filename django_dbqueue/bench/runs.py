"""The benchmark's measurements: enqueue, drain, pickup latency, a drain beside a large
history and beside the supervisors' duties, with no-op jobs on the configured database."""

from __future__ import annotations

import multiprocessing
import os
import platform
import resource
import signal
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings as django_settings
from django.db import connections, router, transaction
from django.db.models import F
from django.utils import timezone

from django_dbqueue.bulk import enqueue_many
from django_dbqueue.conf import settings
from django_dbqueue.enqueueing import enqueue, new_job
from django_dbqueue.models import Duty, Job, ScheduleTick
from django_dbqueue.registry import job
from django_dbqueue.worker.loop import Worker
from django_dbqueue.worker.supervisor import Supervisor

BENCH_QUEUE_NOTE = "dbqueue_bench"
# InnoDB's history list length (undo logs not purged yet) taken as "purged".
PURGED = 1000


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


def wait_for_purge(using: str, timeout: float = 60.0) -> None:
    """On MySQL/MariaDB, wait until InnoDB has purged the rows this benchmark deleted
    before (its history list is short again), so that a drain is not timed while the
    server is still cleaning up after the part before it. PostgreSQL's dead rows are
    left as they are: a drain on them is what a queue meets without VACUUM."""
    if connections[using].vendor != "mysql":
        return
    deadline = time.monotonic() + timeout
    with connections[using].cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute("SHOW GLOBAL STATUS LIKE 'Innodb_history_list_length'")
            row = cursor.fetchone()
            if row is None or int(row[1]) < PURGED:
                return
            time.sleep(0.2)


def warm_up() -> None:
    """One enqueue before the clock starts, as a web process has done before its
    thousandth request: its first opens the wake-up channel and fills the caches of
    statements (80 ms on MariaDB with Redis: a tenth of a 2,000-job measurement)."""
    enqueue(noop)
    clear_jobs()


def bench_enqueue_single(count: int) -> float:
    warm_up()
    started = time.perf_counter()
    for _ in range(count):
        enqueue(noop)
    return _rate(count, time.perf_counter() - started)


def bench_enqueue_single_atomic(count: int) -> float:
    """Each enqueue in its own ``transaction.atomic()``, as in a view under ATOMIC_REQUESTS."""
    using = router.db_for_write(Job)
    warm_up()
    started = time.perf_counter()
    for _ in range(count):
        with transaction.atomic(using=using):
            enqueue(noop)
    return _rate(count, time.perf_counter() - started)


def bench_enqueue_in_transaction(count: int, rounds: int = 10) -> tuple[float, float]:
    """enqueue()'s own cost in the caller's transaction: what a view under
    ATOMIC_REQUESTS pays to enqueue besides the write it makes anyway.

    The same transactions (``atomic()`` around one UPDATE of the caller's, standing for
    saving an order) are timed with and without an enqueue, alternating in ``rounds``;
    the difference is the enqueue's. Returns (enqueues/s of that difference, the caller's
    transactions/s without it): ``atomic()``'s own round trips (``SET autocommit`` on
    MySQL/MariaDB), BEGIN and COMMIT are the caller's, not the enqueue's.
    """
    using = router.db_for_write(Job)
    warm_up()
    # The caller's row: a finished job that no worker claims.
    mine = Job.objects.db_manager(using).create(task="bench.caller", status=Job.Status.CANCELLED)
    caller_write = Job.objects.db_manager(using).filter(pk=mine.pk)
    per_round = max(1, count // rounds)
    without = with_enqueue = 0.0
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(per_round):
            with transaction.atomic(using=using):
                caller_write.update(attempts=F("attempts") + 1)
        middle = time.perf_counter()
        for _ in range(per_round):
            with transaction.atomic(using=using):
                caller_write.update(attempts=F("attempts") + 1)
                enqueue(noop)
        without += middle - started
        with_enqueue += time.perf_counter() - middle
    total = per_round * rounds
    return _rate(total, with_enqueue - without), _rate(total, without)


def bench_enqueue_bulk(count: int) -> float:
    started = time.perf_counter()
    enqueue_many({"task": noop} for _ in range(count))
    return _rate(count, time.perf_counter() - started)


@dataclass(frozen=True)
class Drained:
    rate: float  # jobs/s, from the supervisor's start to its exit
    worker_cpu_us: float  # CPU (user + system) of the worker processes, per job


def bench_drain(
    count: int,
    workers: int,
    batch_size: int | None,
    job_ms: float = 0,
    keys: int = 0,
    key_limit: int = 1,
    threads: int = 1,
    queue: str | None = None,
) -> Drained:
    """Enqueue ``count`` jobs (no-op, or sleeping ``job_ms``), then time ``workers``
    processes of ``threads`` threads draining them, and count their CPU (a steadier
    measure of a change to the worker than the rate, which a loaded machine moves).
    ``keys``: the jobs take turns over that many concurrency keys, at most ``key_limit``
    of each running at once (docs/concurrency.md). ``queue``: the jobs' queue, and the
    only one drained."""

    def spec(n: int) -> dict[str, Any]:
        one: dict[str, Any] = {"task": sleep_ms, "args": [job_ms]} if job_ms else {"task": noop}
        if keys:
            one.update(concurrency_key=f"bench:{n % keys}", concurrency_limit=key_limit)
        return one

    queue = queue or str(settings.DEFAULT_QUEUE)
    wait_for_purge(router.db_for_write(Job))
    enqueue_many({**spec(n), "queue": queue} for n in range(count))
    options: dict[str, Any] = {
        "burst": True,
        "batch_size": batch_size,
        "threads": threads,
        "queues": [queue],
    }
    before = resource.getrusage(resource.RUSAGE_CHILDREN)  # the supervisor reaps them
    started = time.perf_counter()
    stats = Supervisor(workers, options).run()
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    left = Job.objects.filter(status=Job.Status.QUEUED, queue=queue).count()
    if left or stats.done != count:
        raise RuntimeError(f"drain incomplete: {stats.done} done, {left} left of {count}")
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return Drained(_rate(count, elapsed), cpu / count * 1e6)


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


def fill_history(
    rows: int, report: Callable[[str], None], finished_at: datetime | None = None
) -> float:
    """Insert ``rows`` finished jobs, as a busy site has after a while (finished now, or
    at ``finished_at``)."""
    using = router.db_for_write(Job)
    now = timezone.now()
    finished = finished_at or now
    chunk = 5000
    started = time.perf_counter()
    done = 0
    while done < rows:
        size = min(chunk, rows - done)
        batch = [
            new_job(
                {
                    "task": "django_dbqueue.bench.runs.noop",
                    "status": Job.Status.DONE,
                    "owner": "bench-history",
                    "created_at": finished - timedelta(seconds=rows - done - i),
                    "run_after": finished,
                    "finished_at": finished,
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


# The duties benchmark: a queue of its own for the schedule's ticks, which the drain
# leaves alone, and the busy arm's settings.
TICKS_QUEUE = "dbqueue-bench-ticks"
BUSY_DUTIES: dict[str, Any] = {
    # A tick every second, enqueued by the draining supervisor.
    "SCHEDULE": {
        "dbqueue-bench-tick": {"task": f"{__name__}.noop", "every": 1, "queue": TICKS_QUEUE}
    },
    # Every old row is due, and the supervisor takes a turn every 5 s (each prunes for
    # up to 0.5 s): twice as often as a backlog is worked off with the default settings
    # (a supervisor asks every 10 s at most).
    "RETENTION": {"done": 3600},
    "RETENTION_INTERVAL": 5.0,
}
IDLE_DUTIES: dict[str, Any] = {
    "SCHEDULE": {},
    "RETENTION": {"done": None, "failed": None, "cancelled": None},
}


def _settle(using: str) -> None:
    """Between the arms: no leftover ticks or turns, and on PostgreSQL no dead rows from
    the arm before (this benchmark deletes and refills hundreds of thousands of rows)."""
    ScheduleTick.objects.using(using).all().delete()
    Duty.objects.using(using).all().delete()
    Job.objects.using(using).all().delete()
    if connections[using].vendor == "postgresql":
        with connections[using].cursor() as cursor:
            cursor.execute("VACUUM ANALYZE dbqueue_job")


def bench_duties(
    count: int,
    workers: int,
    batch_size: int | None,
    history: int,
    rounds: int,
    report: Callable[[str], None],
) -> dict[str, float]:
    """What the supervisors' duties cost a drain: ``count`` no-op jobs drained beside
    ``history`` rows that finished two days ago, with the duties idle (no schedule, no
    retention) and busy (:data:`BUSY_DUTIES`: a tick every second, and retention pruning
    those rows while the drain runs), interleaved over ``rounds``; medians."""
    from django.test import override_settings

    using = router.db_for_write(Job)
    old = timezone.now() - timedelta(days=2)
    base = dict(getattr(django_settings, "DBQUEUE", {}) or {})
    queues = [*settings.QUEUES, TICKS_QUEUE]
    rates: dict[str, list[float]] = {"idle": [], "busy": []}
    pruned = 0
    arms = [("idle", IDLE_DUTIES), ("busy", BUSY_DUTIES)]
    for index in range(rounds):
        # Each arm goes first in every other round: what one arm leaves behind (InnoDB's
        # purge of the rows deleted before it, say) weighs on both alike.
        for arm, duties in arms if index % 2 == 0 else arms[::-1]:
            _settle(using)
            fill_history(history, lambda line: None, finished_at=old)
            with override_settings(DBQUEUE={**base, **duties, "QUEUES": queues}):
                rate = bench_drain(count, workers, batch_size).rate
            if arm == "busy":
                pruned += history - Job.objects.using(using).filter(finished_at=old).count()
            rates[arm].append(rate)
            report(f"  round {index + 1}, duties {arm}: {rate:,.0f} jobs/s")
    _settle(using)
    idle, busy = statistics.median(rates["idle"]), statistics.median(rates["busy"])
    return {
        "drain_duties_idle_per_s": idle,
        "drain_duties_busy_per_s": busy,
        "duties_cost_pct": 100 * (idle - busy) / idle,
        "duties_pruned_per_round": pruned / rounds,
    }
