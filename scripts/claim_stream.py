"""Statements per 100 no-op jobs for H hosts x C children, from the server's own counters.

    DBQUEUE_DB=mysql DBQUEUE_DB_NAME=claimer_m MYSQL_USER=claimer_m \
        python scripts/claim_stream.py --hosts 3 --children 16 --jobs 30000

MariaDB counts per user only with ``userstat`` on: the scale suite's private servers have
it (``python -m tests.support.scale_servers start``, then ``MYSQL_PORT=3330`` or
``PGPORT=3331`` and a database made there; ``... stop`` at the end).

Each "host" is one ``run_jobs --burst --concurrency C`` process with its own name. The
figures come from the server: MariaDB's ``information_schema.USER_STATISTICS`` for the
user the workers connect as (so run them as a user of their own: other clients of the
server do not count), PostgreSQL's ``pg_stat_database`` (``xact_commit``: one per
statement outside a transaction, one per transaction, so fewer than the statements: the
claims' own statements are counted on the client, ``claim_statements``) for the
database of their own.
On PostgreSQL, the most connections the database had at once during the drain
(``pg_stat_activity``, sampled every 50 ms) is ``peak_connections``.
Claims, their statements and the claim transactions that locked nothing are counted on
the client: the hosts run ``tests/support/counted_claims.py``.

``--delay-ms D``: every request the hosts' connections send waits D ms first, a network
of D ms round trips (tests/support/latency.py; this kernel has no ``sch_netem``).
``--no-handout``: the children of a host claim for themselves, not the supervisor for
them (worker/handout.py).
``--one-queue``: the hosts drain the ``default`` queue only (testproject's workers take
three): on PostgreSQL a claim of one queue is one locking read along the claim index.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")


def sample_connections(stop: threading.Event, peak: list[int]) -> None:
    """The most connections the workers' database had at once (PostgreSQL: its
    pg_stat_activity rows, this sampler's own left out), read every 50 ms."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        while not stop.wait(0.05):
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                [connection.settings_dict["NAME"]],
            )
            peak[0] = max(peak[0], int(cursor.fetchone()[0]))
    connection.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--children", type=int, default=16)
    parser.add_argument("--jobs", type=int, default=30000)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--no-handout", action="store_true")
    parser.add_argument("--one-queue", action="store_true", help="hosts drain 'default' only")
    args = parser.parse_args()
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.db.models import Max, Min

    from django_dbqueue import enqueue_many
    from django_dbqueue.models import Job, WorkerProcess
    from django_dbqueue.worker.handout import hands_out
    from tests.support import counted_claims, jobs
    from tests.support.server_counters import counters, statements

    call_command("migrate", verbosity=0)
    Job.objects.all().delete()
    WorkerProcess.objects.all().delete()
    for start in range(0, args.jobs, 5000):
        enqueue_many({"task": jobs.noop} for _ in range(min(5000, args.jobs - start)))
    connection.close()
    if connection.vendor == "postgresql":
        time.sleep(1)  # pg_stat_database is updated at most every 0.5 s
    log = Path(f"/tmp/claim_stream_{os.getpid()}.log")
    log.unlink(missing_ok=True)
    before = counters()
    connection.close()
    peak, sampling = [0], threading.Event()
    sampler = threading.Thread(target=sample_connections, args=(sampling, peak))
    sampler.start()
    began = time.monotonic()
    host = [sys.executable, "-m", "tests.support.counted_claims", str(log), "--burst"]
    if args.one_queue:
        host += ["--queue", "default"]
    env = {**os.environ, "DBQUEUE_TEST_DELAY_MS": str(args.delay_ms)}
    if args.no_handout:
        env["DBQUEUE_TEST_NO_HANDOUT"] = "1"
    hosts = [
        subprocess.Popen(
            [*host, "--concurrency", str(args.children)],
            stdout=subprocess.DEVNULL,
            cwd=ROOT,
            env=env,
        )
        for _ in range(args.hosts)
    ]
    for proc in hosts:
        proc.wait()
    seconds = time.monotonic() - began
    sampling.set()
    sampler.join()
    if connection.vendor == "postgresql":
        time.sleep(1)
    after = counters()
    done = Job.objects.filter(status=Job.Status.DONE).count()
    # The drain itself, first start to last finish: without the hosts' start and exit.
    span = Job.objects.aggregate(first=Min("started_at"), last=Max("finished_at"))
    drain = (span["last"] - span["first"]).total_seconds() if done else 0.0
    claims = counted_claims.read(str(log))
    transactions = sum(claim[2] for claim in claims)
    empty = sum(claim[3] for claim in claims)
    delta = {key: after[key] - before[key] for key in after}
    sent = statements(before, after)
    print(
        json.dumps(
            {
                "vendor": connection.vendor,
                "hosts": args.hosts,
                "children": args.children,
                "delay_ms": args.delay_ms,
                "handout": not args.no_handout and hands_out(args.children),
                "jobs": args.jobs,
                "done": done,
                "seconds": round(seconds, 2),
                "jobs_per_second": round(done / seconds),
                "drain_seconds": round(drain, 2),
                "drain_jobs_per_second": round(done / max(drain, 0.001)),
                "counters": delta,
                "statements_per_100_jobs": round(100 * sent / max(done, 1), 1),
                "claims": len(claims),
                "claims_with_jobs": sum(1 for claim in claims if claim[1]),
                "claim_statements": sum(claim[0] for claim in claims),
                "statements_per_claim_with_jobs": round(
                    sent / max(1, sum(1 for claim in claims if claim[1])), 1
                ),
                "claim_transactions": transactions,
                "empty_claim_transactions": empty,
                "empty_share": round(empty / max(transactions, 1), 3),
                "peak_connections": peak[0] if connection.vendor == "postgresql" else None,
                # Where they were: in claims that then took jobs, or in claims that found
                # nothing (the end of the drain, other hosts holding the last jobs).
                "empty_in_claims_with_jobs": sum(claim[3] for claim in claims if claim[1]),
                "load": Path("/proc/loadavg").read_text().split()[:3],
            }
        )
    )
    log.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
