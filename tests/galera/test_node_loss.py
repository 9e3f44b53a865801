"""A worker whose Galera node dies: it says once which database it waits for, backs off
(capped) instead of retrying every turn, and carries on when the node is back."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from tests.support import ROOT, reap, wait_until
from tests.support.galera import SQL_PORTS, GaleraCluster

pytestmark = pytest.mark.galera


def read_lines(proc: subprocess.Popen[str], into: list[str]) -> threading.Thread:
    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            into.append(line)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def test_a_worker_on_a_dead_node_waits_quietly_and_comes_back(cluster: GaleraCluster) -> None:
    node = cluster.nodes[2]
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "run_jobs", "--concurrency", "1"],
        cwd=ROOT,
        env=cluster.env(2, HEARTBEAT_INTERVAL=1, POLL_INTERVAL=0.2),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    lines: list[str] = []
    reader = read_lines(proc, lines)
    try:
        wait_until(lambda: cluster.query("SELECT COUNT(*) FROM dbqueue_worker")[0][0] >= 2)
        node.kill()
        wait_until(lambda: any("waiting for" in line for line in lines), timeout=60)
        time.sleep(15)  # an outage long enough for the old code's 5 lines a second
        during = [line for line in lines if "database error" in line]
        # Said once per loop that noticed (supervisor, the child's claim, its recording),
        # with the address: never a line per retry.
        assert 1 <= len(during) <= 4, "".join(during)
        assert all(f"127.0.0.1:{SQL_PORTS[2]}" in line for line in during), during
        node.start()
        wait_until(node.ready, timeout=120, interval=0.5)
        wait_until(lambda: any("answers again" in line for line in lines), timeout=60)
        assert proc.poll() is None, "the worker carried on"
    finally:
        reap([proc])
        reader.join(timeout=10)
        if not node.ready():
            if node.proc is None:
                node.start()
            wait_until(node.ready, timeout=120, interval=0.5)
