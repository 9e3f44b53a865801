"""Recurring ticks with a supervisor on each Galera node: each tick enqueued exactly once,
and the nodes' lost races on a tick are retried quietly (never a warning)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from tests.support import ROOT, reap, wait_until
from tests.support.galera import GaleraCluster, conflict_warnings

pytestmark = pytest.mark.galera

EVERY_SECOND = {"tick": {"task": "tests.support.jobs.noop", "every": 1}}


def test_supervisors_on_three_nodes_enqueue_each_tick_once(cluster: GaleraCluster) -> None:
    cluster.truncate("dbqueue_schedule_tick")
    procs = [
        subprocess.Popen(
            [sys.executable, "manage.py", "run_jobs", "-v", "0"],
            cwd=ROOT,
            env=cluster.env(node, SCHEDULE=EVERY_SECOND, HEARTBEAT_INTERVAL=1),
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for node in range(3)
    ]
    try:
        count = "SELECT COUNT(*) FROM dbqueue_schedule_tick"
        wait_until(lambda: cluster.query(count)[0][0] >= 31, timeout=120, interval=0.5)
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        outputs = [proc.communicate(timeout=60)[0] for proc in procs]
    finally:
        reap(procs)
    seconds = [
        int(row[0])
        for row in cluster.query(
            "SELECT UNIX_TIMESTAMP(tick_at) FROM dbqueue_schedule_tick ORDER BY tick_at"
        )
    ]
    # 30 consecutive ticks and more: no second missing, none twice.
    assert seconds == list(range(seconds[0], seconds[0] + len(seconds)))
    assert len(seconds) >= 31
    jobs = cluster.query("SELECT COUNT(*), COUNT(DISTINCT job_id) FROM dbqueue_schedule_tick")
    assert jobs == [(len(seconds), len(seconds))]
    enqueued = "SELECT COUNT(*) FROM dbqueue_job WHERE task = 'tests.support.jobs.noop'"
    assert cluster.query(enqueued) == [(len(seconds),)]
    assert conflict_warnings(outputs) == []
