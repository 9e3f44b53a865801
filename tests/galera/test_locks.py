"""named_lock across the nodes of a Galera cluster: one holder at a time, cluster-wide."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest

from tests.support import ROOT
from tests.support.galera import GaleraCluster
from tests.support.lock_procs import max_overlap, run_lock_workers

pytestmark = pytest.mark.galera


def test_holders_through_two_nodes_never_overlap(cluster: GaleraCluster) -> None:
    cluster.query("INSERT INTO dbqueue_counter (name, value) VALUES ('shared', 0)")
    workers, iterations = 4, 250  # 1,000 acquisitions
    # No LOCK_BACKEND: the default on a Galera node must be the cluster-wide one.
    reports = run_lock_workers(
        [cluster.env(0), cluster.env(1)],
        workers,
        backend=None,
        name="galera-mutex",
        key="shared",
        increment=True,
        iterations=iterations,
        counter="galera-ids",
        counter_backend="database",
    )
    total = workers * iterations
    assert len(reports) == total
    assert max_overlap(reports) == 1
    # The shared record, read and written back by each holder on its own node.
    assert cluster.query("SELECT value FROM dbqueue_counter WHERE name = 'shared'", node=2) == [
        (total,)
    ]
    by_time = [r["token"] for r in sorted(reports, key=lambda r: r["start"])]
    assert all(a < b for a, b in itertools.pairwise(by_time)), "tokens increase"
    # The counter drawn outside the lock from both nodes at once never repeats a value.
    assert sorted(r["drawn"] for r in reports) == list(range(1, total + 1))


def test_semaphore_across_nodes_never_exceeds_its_limit(cluster: GaleraCluster) -> None:
    reports = run_lock_workers(
        [cluster.env(0), cluster.env(1), cluster.env(2)],
        6,
        backend="galera",
        name="galera-sem",
        limit=2,
        hold=0.01,
        iterations=20,
        counter="galera-sem-ids",
        counter_backend="database",
    )
    assert len(reports) == 120
    assert max_overlap(reports) <= 2


def shell(cluster: GaleraCluster, code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=ROOT,
        env=cluster.env(0),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_mysql_backend_is_refused_with_the_alternatives(cluster: GaleraCluster) -> None:
    done = shell(
        cluster,
        "from django_dbqueue.locks import named_lock\n"
        "with named_lock('x', backend='mysql'): pass\n",
    )
    assert done.returncode != 0
    assert "LockConfigurationError" in done.stderr
    assert "backend='galera'" in done.stderr and "'redis'" in done.stderr
    assert cluster.query("SELECT COUNT(*) FROM dbqueue_lock") == [(0,)]


def test_a_lease_that_ran_out_is_lost_and_taken_over(cluster: GaleraCluster) -> None:
    done = shell(
        cluster,
        "import time\n"
        "from django_dbqueue.locks.galera import GaleraLock\n"
        "first = GaleraLock('lease', timeout=0.5)\n"
        "assert first.acquire(blocking=False)\n"
        "second = GaleraLock('lease', timeout=5)\n"
        "assert not second.acquire(blocking=False)\n"
        "time.sleep(0.8)\n"
        "assert not first.owned()\n"
        "assert second.acquire(blocking=False)\n"
        "second.extend(5)\n"
        "assert second.owned()\n"
        "second.release()\n"
        "print('ok')\n",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("ok")
    assert cluster.query("SELECT COUNT(*) FROM dbqueue_lock") == [(0,)]


def check(cluster: GaleraCluster, *args: str, **settings: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "check", *args],
        cwd=ROOT,
        env=cluster.env(1, **settings),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_check_says_galera_is_supported_and_what_is_node_local(cluster: GaleraCluster) -> None:
    done = check(cluster, "--database", "default")
    assert done.returncode == 0, done.stderr
    said = done.stdout + done.stderr  # Django writes the messages to stderr
    assert "django_dbqueue.I110" in said and "Galera" in said
    assert "Node-local: GET_LOCK" in said
    assert "W111" not in said, "the suite's cluster runs with the recommended settings"
    plain = check(cluster)  # no --database: Django's rule, checks do not query servers
    assert "I110" not in plain.stdout + plain.stderr
    deploy = check(cluster, "--deploy")
    assert "django_dbqueue.I110" in deploy.stdout + deploy.stderr


def test_check_refuses_the_mysql_lock_backend_on_galera(cluster: GaleraCluster) -> None:
    done = check(cluster, "--database", "default", LOCK_BACKEND="mysql")
    assert done.returncode != 0
    assert "django_dbqueue.E111" in done.stderr
