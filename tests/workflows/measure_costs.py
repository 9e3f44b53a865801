"""Cost figures of issue #29 item 6 (docs/benchmarks.md), run by hand:

    DBQUEUE_DB=mysql DBQUEUE_DB_NAME=bench_dbq_flows29 CHUNK=25 \
        .venv/bin/python -m tests.workflows.measure_costs

1. Finishing members of one batch from 4 workers at once (4 threads, a connection
   each, one finish per member: the worst case, every finish its own transaction):
   plain jobs, batch members with the 16 counter shards, and with one shard (the hot
   row the shards avoid); interleaved rounds, medians.
2. What plain jobs pay: the finish UPDATE with and without the ``workflow = false``
   guard (interleaved), and the Python added per job and per claim.
Not a test: it asserts nothing; it prints figures.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
import timeit

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")

import django

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection, connections  # noqa: E402

from django_dbqueue import enqueue_batch, enqueue_many  # noqa: E402
from django_dbqueue.models import Batch, BatchCounter, Job  # noqa: E402
from django_dbqueue.queue import batches, finish, ratelimits  # noqa: E402
from django_dbqueue.workflows.results import CURRENT_JOB  # noqa: E402

N, WORKERS, ROUNDS = 2000, 4, 3
CHUNK = int(os.environ.get("CHUNK", "1"))  # finishes per write (the worker: up to 100)
TASK = "tests.support.jobs.noop"


def reset() -> None:
    Job.objects.all().delete()
    Batch.objects.all().delete()
    BatchCounter.objects.all().delete()


def lock_waits() -> int:
    if connection.vendor != "mysql":
        return 0
    with connection.cursor() as cursor:
        cursor.execute("SHOW GLOBAL STATUS LIKE 'Innodb_row_lock_waits'")
        return int(cursor.fetchone()[1])


def drain(kind: str) -> tuple[float, int]:
    reset()
    specs = [{"task": TASK} for _ in range(N)]
    if kind == "plain":
        enqueue_many(specs)
    else:
        batches.SHARDS = 16 if kind == "batch, 16 shards" else 1
        enqueue_batch(specs)
    claimed = [list(Job.objects.claim(f"w{n}", N // WORKERS)) for n in range(WORKERS)]
    assert sum(map(len, claimed)) == N

    def work(owner: str, jobs: list[Job]) -> None:
        for start in range(0, len(jobs), CHUNK):
            finish.finish_done(Job, "default", owner, jobs[start : start + CHUNK])
        connections.close_all()

    threads = [
        threading.Thread(target=work, args=(f"w{n}", jobs)) for n, jobs in enumerate(claimed)
    ]
    waits = lock_waits()
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    took = time.perf_counter() - began
    assert Job.objects.filter(status="done").count() == N
    return took, lock_waits() - waits


def guard_cost() -> tuple[float, float]:
    """Median seconds of the finish UPDATE of 100 claimed plain jobs, without and with
    the workflow guard, interleaved."""
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(10):
        for guard in (False, True):
            reset()
            enqueue_many([{"task": TASK} for _ in range(100)])
            jobs = list(Job.objects.claim("g", 100))
            began = time.perf_counter()
            finish._update_done(Job, "default", "g", jobs, plain_only=guard)
            times[guard].append(time.perf_counter() - began)
    return statistics.median(times[False]), statistics.median(times[True])


def main() -> None:
    call_command("migrate", verbosity=0)
    print(
        f"database: {connection.vendor}; {N} jobs, {WORKERS} workers, {ROUNDS} rounds, "
        f"{CHUNK} finish(es) per write"
    )
    kinds = ("plain", "batch, 16 shards", "batch, 1 shard")
    results: dict[str, list[tuple[float, int]]] = {k: [] for k in kinds}
    for _ in range(ROUNDS):
        for kind in kinds:
            results[kind].append(drain(kind))
    for kind in kinds:
        took = statistics.median(t for t, _ in results[kind])
        waits = statistics.median(w for _, w in results[kind])
        print(
            f"  {kind:18} {N / took:7.0f} finishes/s  (median {took:.2f} s, "
            f"server row lock waits +{waits})"
        )
    plain, guarded = guard_cost()
    print(
        f"finish UPDATE of 100 plain jobs: {plain * 1e3:.2f} ms, with the workflow guard "
        f"{guarded * 1e3:.2f} ms"
    )
    empty = timeit.timeit(lambda: None, number=100_000) / 100_000
    print(f"yardstick: an empty call {empty * 1e9:.0f} ns")
    ctx = timeit.timeit(lambda: CURRENT_JOB.reset(CURRENT_JOB.set(1)), number=100_000) / 100_000
    print(f"per job: the current-job context {ctx * 1e9:.0f} ns")
    per_claim = timeit.timeit(lambda: ratelimits.limited(["default"]), number=100_000) / 100_000
    print(f"per claim: the rate-limit lookup (none set) {per_claim * 1e9:.0f} ns")
    reset()


if __name__ == "__main__":
    main()
