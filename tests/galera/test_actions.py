"""Operator actions on one Galera node racing workers on the other two.

An operator on n1 cancels, requeues and retries failed jobs (the queryset methods the
admin actions call, and ``dbqueue_jobs``) over and over while supervisors on n2 and n3
claim and finish the same rows. Their writes lose certification to the workers' (1213):
each such conflict is retried quietly (counted, DEBUG), never a WARNING nor an error
for the operator, and the queue ends consistent.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT, reap, wait_until
from tests.support.galera import GaleraCluster, Supervisors, conflict_warnings

pytestmark = pytest.mark.galera

JOBS = 600
ROUNDS = 40

OPERATOR = f"""
import io, json, logging, random
import django, os
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
django.setup()
from django.core.management import call_command
from django_dbqueue import enqueue_many
from django_dbqueue.models import Job
from django_dbqueue.queue.conflicts import COUNTS
from tests.support import jobs


class Heard(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.levels = []

    def emit(self, record):
        self.levels.append(record.levelname)


heard = Heard()
logging.getLogger().addHandler(heard)  # everything propagates to the root
logging.getLogger("django_dbqueue.actions").setLevel(logging.DEBUG)

enqueue_many(
    {{"task": jobs.record if n % 3 else jobs.fail, "args": [f"k{{n}}"] if n % 3 else [],
      "max_attempts": 1}}
    for n in range({JOBS})
)
ids = list(Job.objects.values_list("pk", flat=True))
print("enqueued", flush=True)
input()  # the supervisors on the other nodes run
rng = random.Random(31)
quiet = io.StringIO()
most = 0  # the most retries one action needed


def act(action, *args, **kwargs):
    global most
    before = len(heard.levels)
    action(*args, **kwargs)
    most = max(most, len(heard.levels) - before)


for round in range({ROUNDS}):
    chunk = Job.objects.filter(pk__in=rng.sample(ids, 60))
    act(chunk.cancel)
    act(chunk.requeue)
    more = [str(pk) for pk in rng.sample(ids, 60)]
    act(call_command, "dbqueue_jobs", "cancel", *more, stdout=quiet)
    act(call_command, "dbqueue_jobs", "requeue", "--run-now", *more, stdout=quiet)
    act(call_command, "dbqueue_jobs", "retry-failed", stdout=quiet)
levels = {{level: heard.levels.count(level) for level in set(heard.levels)}}
print(json.dumps({{"conflicts": COUNTS, "levels": levels, "most_in_one_action": most}}))
"""


def test_operator_actions_racing_workers_on_other_nodes_retry_quietly(
    cluster: GaleraCluster, tmp_path: Path
) -> None:
    cluster.truncate("testproject_execution")
    operator = subprocess.Popen(
        [sys.executable, "-c", OPERATOR],
        cwd=ROOT,
        env=cluster.env(0),
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    supervisors = Supervisors(cluster, tmp_path)
    try:
        assert operator.stdout is not None
        assert operator.stdout.readline().strip() == "enqueued"
        for node in (1, 2):
            supervisors.start(node, "--concurrency", "2", POLL_INTERVAL=0.05)
        wait_until(lambda: cluster.query("SELECT COUNT(*) FROM testproject_execution")[0][0])
        said, errors = operator.communicate("go\n", timeout=600)
        assert operator.returncode == 0, errors  # never a raw 1213, nor ActionConflict
        unfinished = "SELECT COUNT(*) FROM dbqueue_job WHERE status IN ('queued', 'claimed')"
        wait_until(lambda: cluster.query(unfinished) == [(0,)], timeout=300, interval=0.5)
    finally:
        outputs = supervisors.stop()
        reap([operator])
    report = json.loads(said.splitlines()[-1])
    # Certification conflicts were met and retried, each counted and said at DEBUG only.
    assert sum(report["conflicts"].values()) > 0, report
    assert report["levels"].get("WARNING", 0) == report["levels"].get("ERROR", 0) == 0, errors
    assert [line for line in errors.splitlines() if "1213" in line and " DEBUG " not in line] == []
    assert conflict_warnings(outputs) == []
    # The queue ends consistent: every job finished one way or another, none lost.
    statuses = dict(cluster.query("SELECT status, COUNT(*) FROM dbqueue_job GROUP BY status"))
    assert sum(statuses.values()) == JOBS and set(statuses) <= {"done", "failed", "cancelled"}
    print(json.dumps(report))
