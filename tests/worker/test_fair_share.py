"""Workers draining one queue together: contention is not an empty queue, and a process
claims only what it can start soon, so every process does its share."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest

from django_dbqueue import enqueue_many
from django_dbqueue.models import Job
from tests.support import Processes, jobs

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]


def test_two_burst_workers_each_drain_a_fair_share(
    processes: Processes, worker_env: Callable[..., dict[str, str]]
) -> None:
    total = 20_000
    enqueue_many({"task": jobs.noop} for _ in range(total))
    env = worker_env()
    workers = [processes.run_jobs("--burst", env=env) for _ in range(2)]
    for proc in workers:
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, out
    assert Job.objects.filter(status=Job.Status.DONE).count() == total
    # Each run_jobs is a supervisor with one child; the child's name is the owner.
    owners = Counter(Job.objects.values_list("owner", flat=True))
    assert len(owners) == 2, owners
    assert min(owners.values()) >= 0.3 * total, f"one worker idled or left early: {owners}"


def test_slow_jobs_are_spread_over_both_children(
    processes: Processes, worker_env: Callable[..., dict[str, str]]
) -> None:
    enqueue_many({"task": jobs.sleep, "args": [0.5]} for _ in range(8))
    proc = processes.run_jobs("--burst", "--concurrency", "2", env=worker_env())
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    done = Job.objects.filter(status=Job.Status.DONE)
    assert done.count() == 8
    owners = Counter(done.values_list("owner", flat=True))
    assert len(owners) == 2, f"one child held every job: {owners}"
    first = min(done.values_list("started_at", flat=True))
    last = max(done.values_list("finished_at", flat=True))
    # 4 s of sleep over 2 children: 2 s when shared, 3.5 s or more when one child hoards.
    assert (last - first).total_seconds() < 2.5, owners
