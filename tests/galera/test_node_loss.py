"""A Galera node dies under a worker that is running a job.

The worker on n3 says once (per loop) which database it waits for, then retries with a
growing pause capped at ``MAX_BACKOFF`` (its DEBUG lines say each pause), never a line
per retry; the supervisor on n1 recovers the job once its lease has run out (not
before) and runs it again (at-least-once: the dead node's run may have done its work);
when n3 is back, the worker there carries on and its late result changes nothing.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from django_dbqueue.worker.connections import MAX_BACKOFF
from tests.support import ROOT, reap, wait_until
from tests.support.galera import SQL_PORTS, GaleraCluster, Supervisors

pytestmark = pytest.mark.galera

LEASE = 10  # seconds; the recovering supervisor's LEASE_TIMEOUT
OUTAGE = 20  # seconds n3 stays dead after the worker said it waits
RETRY = re.compile(r"^.* DEBUG \S+: (?P<who>.+?): database error .*retrying in (?P<pause>[\d.]+) s")


def read_lines(proc: subprocess.Popen[str], into: list[str]) -> threading.Thread:
    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            into.append(line)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def enqueue_held_job(cluster: GaleraCluster, gate: Path) -> None:
    code = (
        "from django_dbqueue import enqueue\n"
        "from tests.support import jobs\n"
        f"enqueue(jobs.hold_until, args=[{str(gate)!r}, 'held'], max_attempts=3)\n"
    )
    cluster.shell(code, timeout=120)


def retry_pauses(lines: list[str]) -> dict[str, list[float]]:
    """The pauses each waiting loop announced at DEBUG, in order, by who said them."""
    pauses: dict[str, list[float]] = {}
    for line in lines:
        if match := RETRY.match(line):
            pauses.setdefault(match["who"], []).append(float(match["pause"]))
    return pauses


def test_a_dead_nodes_worker_waits_quietly_and_its_job_is_recovered_after_the_lease(
    cluster: GaleraCluster, tmp_path: Path
) -> None:
    cluster.truncate("testproject_execution")
    node, gate = cluster.nodes[2], tmp_path / "gate"
    settings = {"HEARTBEAT_INTERVAL": 1, "POLL_INTERVAL": 0.2, "LEASE_TIMEOUT": LEASE}
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "run_jobs", "--concurrency", "1"],
        cwd=ROOT,
        env={
            **cluster.env(2, **settings),
            "DBQUEUE_TEST_DEBUG_LOGGERS": "django_dbqueue.supervisor,django_dbqueue.worker",
        },
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    lines: list[str] = []
    reader = read_lines(proc, lines)
    recoverer = Supervisors(cluster, tmp_path)
    runs = "SELECT COUNT(*) FROM testproject_execution WHERE `key` = 'held'"
    try:
        enqueue_held_job(cluster, gate)
        wait_until(lambda: cluster.query(runs) == [(1,)], timeout=120)  # running on n3
        recoverer.start(0, "--concurrency", "1", **settings)
        wait_until(lambda: cluster.query("SELECT COUNT(*) FROM dbqueue_worker")[0][0] >= 4)
        node.kill()
        gate.touch()  # n3's run ends; its result cannot reach the database
        wait_until(lambda: any("waiting for" in line for line in lines), timeout=60)
        said_at = len(lines)
        time.sleep(OUTAGE)
        warned = [line for line in lines if " WARNING " in line and "database error" in line]
        # Said once per loop that noticed (supervisor, the child's recording), with the
        # address: never a line per retry.
        assert 1 <= len(warned) <= 4, "".join(warned)
        assert all(f"127.0.0.1:{SQL_PORTS[2]}" in line for line in warned), warned
        # Each loop backs off: pauses that grow to the cap and never pass it.
        pauses = retry_pauses(lines[said_at:])
        assert pauses, "".join(lines[-20:])
        for who, each in pauses.items():
            assert max(each) <= MAX_BACKOFF, (who, each)
            assert len(each) <= OUTAGE, (who, each)  # the old code: 5 a second
        longest = max(pauses.values(), key=len)
        assert max(longest) >= 0.75 * MAX_BACKOFF, pauses  # reached the cap (jittered)
        # n1's supervisor recovered the job once its lease ran out, and ran it again.
        wait_until(
            lambda: cluster.query("SELECT status FROM dbqueue_job") == [("done",)], timeout=60
        )
        node.start()
        wait_until(node.ready, timeout=120, interval=0.5)
        wait_until(lambda: any("answers again" in line for line in lines), timeout=60)
        assert proc.poll() is None, "the worker carried on"
    finally:
        outputs = recoverer.stop()
        reap([proc])
        reader.join(timeout=10)
        if not node.ready():
            if node.proc is None:
                node.start()
            wait_until(node.ready, timeout=120, interval=0.5)
    ((status, error),) = cluster.query("SELECT status, last_error FROM dbqueue_job")
    assert status == "done" and "stopped renewing its lease" in error, error
    starts = [
        at
        for (at,) in cluster.query(
            "SELECT created_at FROM testproject_execution WHERE `key` = 'held' ORDER BY id"
        )
    ]
    assert len(starts) == 2, "ran on n3, then once more after the recovery"
    assert (starts[1] - starts[0]).total_seconds() >= LEASE, "recovered before its lease ran out"
    assert "Recovered 1 job(s)" in outputs[0], outputs[0]
    rerun_after = round((starts[1] - starts[0]).total_seconds(), 1)
    print(json.dumps({"retry_pauses": pauses, "second_run_after_first": rerun_after}))
