"""Two nodes racing ``enqueue(unique_key=...)`` inside ``transaction.atomic()``: one job
per key, and the caller that loses certification gets 1213 at commit, which the retry of
docs/databases.md turns into the existing job."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support import ROOT, reap
from tests.support.galera import GaleraCluster

pytestmark = pytest.mark.galera

KEYS = 300

# The retry docs/databases.md gives enqueue callers on Galera, with a count of the 1213s.
RACER = f"""
import json, os, random, sys, time
import django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
django.setup()
from django.db import OperationalError, transaction
from django_dbqueue import enqueue
from tests.support import jobs

print("ready", flush=True)
sys.stdin.readline()
got, refused = {{}}, 0
for i in range({KEYS}):
    key = f"race-{{i}}"
    for attempt in range(10):
        try:
            with transaction.atomic():
                got[key] = enqueue(jobs.noop, unique_key=key).pk
            break
        except OperationalError as exc:
            if exc.args[0] != 1213 or attempt == 9:
                raise
            refused += 1
            time.sleep(random.uniform(0, 0.01 * 2 ** min(attempt, 5)))
print(json.dumps({{"got": got, "refused": refused}}), flush=True)
"""


def test_unique_keys_stay_unique_across_nodes_and_the_retry_gets_the_job(
    cluster: GaleraCluster,
) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACER],
            cwd=ROOT,
            env=cluster.env(node),
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for node in (0, 1)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.close()
        results = []
        for proc in procs:
            assert proc.stdout is not None and proc.stderr is not None
            out = proc.stdout.read()  # what it says is short: stderr cannot fill up
            assert proc.wait(timeout=600) == 0, proc.stderr.read()
            results.append(json.loads(out.splitlines()[-1]))
    finally:
        reap(procs)
    rows = cluster.query(
        "SELECT unique_key, id FROM dbqueue_job WHERE unique_key LIKE 'race-%%'", node=2
    )
    ids = dict(rows)
    assert len(rows) == KEYS == len(ids), "one job per key, cluster-wide"
    for result in results:
        assert result["got"] == ids, "every caller got the key's one job"
    print(json.dumps({"refused_at_commit": [r["refused"] for r in results]}))
