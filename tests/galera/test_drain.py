"""The queue across the writer nodes of a Galera cluster: drains exactly once, quietly.

Each run: a few thousand jobs enqueued through n1, then three ``run_jobs --burst
--concurrency 2`` supervisors started together, either one per node ("spread") or all
three on n1 ("one node"), until they exit. The two layouts run interleaved; their rates
are reported (``DBQUEUE_GALERA_FIGURES`` names a file to append them to), never asserted:
on a loaded machine a rate is noise, its ratio over interleaved pairs is the figure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.support import ROOT, reap
from tests.support.galera import GaleraCluster, conflict_warnings

pytestmark = pytest.mark.galera

JOBS = 3000
SUPERVISORS = 3


def enqueue(cluster: GaleraCluster, prefix: str, count: int) -> None:
    code = (
        "from django_dbqueue import enqueue_many\n"
        "from tests.support.jobs import record\n"
        f"enqueue_many({{'task': record, 'args': ['{prefix}-%d' % i]}} for i in range({count}))\n"
    )
    cluster.shell(code)


def drain(cluster: GaleraCluster, nodes: list[int]) -> tuple[float, list[str]]:
    """Seconds from the supervisors' start to the last one's exit, and their outputs."""
    began = time.monotonic()
    procs = [
        subprocess.Popen(
            [sys.executable, "manage.py", "run_jobs", "--burst", "--concurrency", "2"],
            cwd=ROOT,
            env={
                **cluster.env(node, LEASE_TIMEOUT=60),
                "DBQUEUE_TEST_DEBUG_LOGGERS": "django_dbqueue.actions",
            },
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for node in nodes
    ]
    try:
        outputs = [proc.communicate(timeout=600)[0] for proc in procs]
    finally:
        reap(procs)
    assert [proc.returncode for proc in procs] == [0] * len(procs), outputs
    return time.monotonic() - began, outputs


def test_supervisors_on_three_nodes_drain_exactly_once(cluster: GaleraCluster) -> None:
    layouts = {"spread": [0, 1, 2], "one node": [0] * SUPERVISORS}
    seconds: dict[str, list[float]] = {name: [] for name in layouts}
    conflicts: dict[str, list[int]] = {name: [] for name in layouts}
    for run in range(2):
        for name, nodes in layouts.items() if run % 2 == 0 else reversed(layouts.items()):
            cluster.truncate("dbqueue_job", "testproject_execution", "dbqueue_worker")
            prefix = f"{name[0]}{run}"
            enqueue(cluster, prefix, JOBS)
            took, outputs = drain(cluster, nodes)
            seconds[name].append(took)
            # Exactly once: every job done, each ran once (a record row per run).
            assert cluster.query("SELECT status, COUNT(*) FROM dbqueue_job GROUP BY status") == [
                ("done", JOBS)
            ]
            assert cluster.query(
                "SELECT COUNT(*), COUNT(DISTINCT `key`) FROM testproject_execution", node=2
            ) == [(JOBS, JOBS)]
            # Certification conflicts are retried quietly: none reaches a warning.
            assert conflict_warnings(outputs) == []
            conflicts[name].append(
                sum(out.count("conflict with another writer") for out in outputs)
            )
    figures = {name: [round(JOBS / s, 1) for s in took] for name, took in seconds.items()}
    ratio = sum(seconds["one node"]) / sum(seconds["spread"])
    report = {
        "jobs_per_second": figures,
        "spread_over_one_node": round(ratio, 3),
        "conflicts_retried": conflicts,
    }
    print(json.dumps(report))
    if os.environ.get("DBQUEUE_GALERA_FIGURES"):
        with open(os.environ["DBQUEUE_GALERA_FIGURES"], "a") as out:
            out.write(json.dumps(report) + "\n")
