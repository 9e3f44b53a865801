"""Row writes a batch adds per member finish, counted by the server, and 2 x 2 real
workers draining one 10,000-member batch (docs/benchmarks.md, issue #29 item 6). Run by
hand, on a database of its own:

    DBQUEUE_DB=mysql DBQUEUE_DB_NAME=bench_t_flows \
        .venv/bin/python -m tests.workflows.measure_writes
    (and DBQUEUE_DB=postgres)

1. 10,000 claimed jobs finished from one connection, 1 and 100 finishes per write:
   plain jobs, then members of one batch. Writes are the server's own counters: on
   MariaDB this session's ``Handler_update`` + ``Handler_write`` + ``Handler_delete``
   (a session counter: other sessions' work is not in it); on PostgreSQL
   ``pg_stat_user_tables`` (``n_tup_ins + n_tup_upd + n_tup_del``) of this database.
2. MariaDB: 2 supervisors x 2 children (``run_jobs --concurrency 2 --burst``) drain
   10,000 plain jobs, then one 10,000-member batch; the server's ``Innodb_row_lock_waits``
   (global: other sessions' waits are in it) and this database's counter rows.
``PARTS=writes`` or ``PARTS=workers`` runs one of the two.
Not a test: it asserts only that the drains finished; it prints figures.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")

import django

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from django_dbqueue import enqueue_batch, enqueue_many  # noqa: E402
from django_dbqueue.models import Batch, BatchCounter, Job  # noqa: E402
from django_dbqueue.queue import finish  # noqa: E402

N = int(os.environ.get("N", "10000"))
TASK = "tests.support.jobs.noop"
TABLES = ("dbqueue_job", "dbqueue_batch_counter", "dbqueue_batch")


def reset() -> None:
    Job.objects.all().delete()
    Batch.objects.all().delete()
    BatchCounter.objects.all().delete()


def writes() -> int:
    """Rows written so far, by the server's counters."""
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute(
                "SHOW SESSION STATUS WHERE Variable_name IN "
                "('Handler_update', 'Handler_write', 'Handler_delete')"
            )
            return sum(int(value) for _, value in cursor.fetchall())
        cursor.execute("SELECT pg_stat_force_next_flush()")
        connection.close()  # the session's counts reach the statistics on its way out
        time.sleep(1.0)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT COALESCE(SUM(n_tup_ins + n_tup_upd + n_tup_del), 0) "
            "FROM pg_stat_user_tables WHERE relname = ANY(%s)",
            [list(TABLES)],
        )
        return int(cursor.fetchone()[0])


def finish_all(kind: str, chunk: int) -> int:
    """Rows written while ``N`` claimed jobs of ``kind`` are finished, ``chunk`` per write."""
    reset()
    specs = [{"task": TASK} for _ in range(N)]
    if kind == "plain":
        enqueue_many(specs)
    else:
        enqueue_batch(specs, close=True)
    claimed: list[Job] = []
    while len(claimed) < N:
        claimed += Job.objects.claim("m", 1000)
    before = writes()
    for start in range(0, N, chunk):
        finish.finish_done(Job, "default", "m", claimed[start : start + chunk])
    written = writes() - before
    assert Job.objects.filter(status="done").count() == N
    if kind != "plain":
        assert Batch.objects.filter(completed_at__isnull=False).count() == 1
    return written


def global_status(name: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SHOW GLOBAL STATUS LIKE %s", [name])
        return int(cursor.fetchone()[1])


def drain_with_workers(kind: str) -> tuple[float, int, int]:
    """(seconds, server row lock waits, ms waited) of 2 x 2 workers draining ``N`` jobs."""
    reset()
    specs = [{"task": TASK} for _ in range(N)]
    enqueue_many(specs) if kind == "plain" else enqueue_batch(specs)
    connection.close()
    command = [sys.executable, "-m", "django", "run_jobs", "--concurrency", "2", "--burst"]
    waits, waited = global_status("Innodb_row_lock_waits"), global_status("Innodb_row_lock_time")
    began = time.monotonic()
    procs = [subprocess.Popen(command, stdout=subprocess.DEVNULL) for _ in range(2)]
    for proc in procs:
        assert proc.wait(900) == 0
    took = time.monotonic() - began
    assert Job.objects.filter(status="done").count() == N
    lock_waits = global_status("Innodb_row_lock_waits") - waits
    return took, lock_waits, global_status("Innodb_row_lock_time") - waited


def main() -> None:
    call_command("migrate", verbosity=0)
    print(f"database: {connection.vendor}; {N} jobs; load {open('/proc/loadavg').read()[:14]}")
    parts = os.environ.get("PARTS", "writes,workers").split(",")
    for chunk in (1, 100) if "writes" in parts else ():
        plain = finish_all("plain", chunk)
        member = finish_all("batch", chunk)
        print(
            f"  {chunk:3} finish(es) per write: plain {plain} rows ({plain / N:.3f}/job), "
            f"batch members {member} rows ({member / N:.3f}/job): "
            f"+{(member - plain) / N:.3f} row writes per member finish"
        )
    if connection.vendor == "mysql" and "workers" in parts:
        for kind in ("plain", "batch", "plain", "batch"):
            took, waits, waited = drain_with_workers(kind)
            print(
                f"  2 x 2 workers, {N} {kind:5}: {took:6.1f} s, {N / took:5.0f} jobs/s, "
                f"server row lock waits +{waits} ({waited} ms)"
            )
    print(f"load after: {open('/proc/loadavg').read()[:14]}")
    reset()


if __name__ == "__main__":
    main()
