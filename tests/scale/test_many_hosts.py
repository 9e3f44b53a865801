"""Three hosts of many children draining one queue table: every job runs exactly once,
within a bound of statements the server itself counted, and so it does over a network
of 20 ms round trips (tests/support/latency.py).

A "host" is one ``run_jobs`` process (a supervisor and its children) with a name of its
own; hosts share nothing but the database, as separate machines would. They run against
the scale suite's private servers (``nox -s scale``: tests/support/scale_servers.py),
whose MariaDB counts statements per user; only the test's hosts and the test itself
connect to them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from django.db import connection

from django_dbqueue import enqueue_many
from django_dbqueue.models import Job
from tests.support import ROOT, Processes, counted_claims, jobs
from tests.support.counted_claims import Claim
from tests.support.server_counters import counters, statements

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.processes,
    pytest.mark.scale,
    pytest.mark.only_vendor("mysql", "postgres"),  # SQLite: one host
]

HOSTS = 3
# Statements per 100 no-op jobs, 3 hosts x 8 children, claims of whole batches
# (CLAIM_AHEAD = 0), counted by the server. Claims sized to what a child can start soon
# (the default) shrink with the machine's load and under coverage: 30 per 100 jobs at
# load 3-5, 55 under coverage at load 5, where whole batches stay at about 15.
STATEMENTS_PER_100_JOBS = 40


def server_counts_statements() -> None:
    if connection.vendor == "mysql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT @@userstat")
            (on,) = cursor.fetchone()
        assert on, "MariaDB's userstat is off: run the scale tests with `nox -s scale`"


def drain(
    processes: Processes, env: dict[str, str], children: int, total: int, tmp_path: Path
) -> tuple[int, list[Claim], set[int]]:
    """``total`` jobs drained by HOSTS hosts of ``children`` at once: (statements the
    server counted meanwhile, the claims the hosts logged, the hosts' pids). Asserts each
    ran once."""
    server_counts_statements()
    marks = tmp_path / "marks"
    marks.mkdir()
    enqueue_many({"task": jobs.mark, "args": [str(marks), n]} for n in range(total))
    log = str(tmp_path / "claims")
    if connection.vendor == "postgresql":
        time.sleep(1)  # pg_stat_database takes in the enqueue's commits at most every 0.5 s
    before = counters()
    run_jobs = ("--burst", "--concurrency", str(children))
    hosts = [counted_claims.start(processes, log, *run_jobs, env=env) for _ in range(HOSTS)]
    for host in hosts:
        out, _ = host.communicate(timeout=600)
        assert host.returncode == 0, out
    if connection.vendor == "postgresql":
        time.sleep(1)
    sent = statements(before, counters())
    runs = Counter(int(line) for path in marks.iterdir() for line in path.read_text().split())
    assert set(runs) == set(range(total))
    assert set(runs.values()) == {1}, [n for n, count in runs.items() if count > 1][:10]
    done = Job.objects.filter(status=Job.Status.DONE, attempts=1)
    assert done.count() == total
    return sent, counted_claims.read(log), {host.pid for host in hosts}


def test_three_hosts_of_eight_drain_exactly_once_in_few_statements(
    processes: Processes, worker_env: Callable[..., dict[str, str]], tmp_path: Path
) -> None:
    total = 12000
    sent, claims, _ = drain(processes, worker_env(CLAIM_AHEAD=0), 8, total, tmp_path)
    assert sum(claim[1] for claim in claims) == total
    assert 100 * sent / total <= STATEMENTS_PER_100_JOBS, (sent, len(claims))


# 3 hosts x 16 children, claims sized as by default: each supervisor claims for its
# children (worker/handout.py), 30,000 jobs as in the measure (a drain ends with
# a few claims per host that find nothing: in a shorter one they weigh more). Measured
# without coverage (docs/benchmarks.md): 6.7-7.1 statements per 100 jobs on MariaDB and
# 3.8 transactions on PostgreSQL, 6-7% of claim transactions empty; 80.8 statements on
# MariaDB with the children claiming for themselves. Under coverage and load the server
# counts more, and more the more loaded it is (12,000 jobs: 20.7 at load 2, 25.8 at
# load 14 on MariaDB): the results are written in smaller batches, and each child's
# demand, so its share of a claim, comes smaller. The claims alone sent 9.7-13.4.
HOST_STREAM_PER_100_JOBS = 25


def test_three_hosts_of_sixteen_claim_one_stream_each(
    processes: Processes, worker_env: Callable[..., dict[str, str]], tmp_path: Path
) -> None:
    total = 30000
    sent, claims, hosts = drain(processes, worker_env(), 16, total, tmp_path)
    transactions = sum(claim[2] for claim in claims)
    empty = sum(claim[3] for claim in claims)
    stream = sum(claim[0] for claim in claims)
    figures = {
        "server statements per 100 jobs": round(100 * sent / total, 1),
        "claims": len(claims),
        "claim statements": stream,
        "transactions": transactions,
        "empty": empty,
        "claims per process": Counter(claim[4] for claim in claims),
    }
    assert sum(claim[1] for claim in claims) == total, figures
    # One stream per host: every claim was a supervisor's (its claimer thread's).
    assert {claim[4] for claim in claims} == hosts, figures
    assert 100 * stream / total <= HOST_STREAM_PER_100_JOBS, figures
    assert 100 * sent / total <= STATEMENTS_PER_100_JOBS, figures
    assert empty < 0.2 * transactions, figures


def test_three_hosts_drain_exactly_once_over_20_ms_round_trips(
    processes: Processes, worker_env: Callable[..., dict[str, str]], tmp_path: Path
) -> None:
    total = 1500
    env = {**worker_env(), "DBQUEUE_TEST_DELAY_MS": "20"}
    _, claims, _ = drain(processes, env, 4, total, tmp_path)
    assert sum(claim[1] for claim in claims) == total


def test_the_injected_delay_holds_every_request(
    worker_env: Callable[..., dict[str, str]],
) -> None:
    """Each request of a connection waits the delay: five queries and a transaction's
    BEGIN and COMMIT at 50 ms take at least 7 x 50 ms, and are counted."""
    script = (
        "import django, time; django.setup()\n"
        "from django.db import connection, transaction\n"
        "from tests.support import latency\n"
        "connection.ensure_connection(); latency.install(50)\n"
        "began = time.monotonic()\n"
        "with connection.cursor() as cursor:\n"
        "    for _ in range(5): cursor.execute('SELECT 1')\n"
        "with transaction.atomic(), connection.cursor() as cursor:\n"
        "    cursor.execute('SELECT 1')\n"
        "print(latency.sent(), time.monotonic() - began)\n"
    )
    env = {**worker_env(), "DJANGO_SETTINGS_MODULE": "testproject.settings"}
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    sent, seconds = done.stdout.split()
    # 5 + the atomic block's: MariaDB SET autocommit twice, COMMIT, the SELECT; PostgreSQL
    # its BEGIN goes with the SELECT, then COMMIT.
    assert int(sent) >= 7
    assert float(seconds) >= int(sent) * 0.05
    assert os.environ.get("DBQUEUE_TEST_DELAY_MS") is None  # the test run itself: none
