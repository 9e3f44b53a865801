"""Real worker processes against the real database."""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Callable

import pytest

from django_dbqueue import enqueue_many
from django_dbqueue.models import Job, WorkerProcess
from testproject.models import Execution
from tests.support import Processes, jobs, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]


def test_concurrent_workers_never_share_or_lose_a_job(
    processes: Processes, worker_env: Callable[..., dict[str, str]]
) -> None:
    total = 3000
    # Idle workers poll every 50 ms: where no wake-up reaches them (SQLite without
    # Redis), the drain may be over within one default poll interval.
    env = worker_env(POLL_INTERVAL=0.05)
    workers = [
        processes.run_jobs("--batch-size", "25", env=env),
        processes.run_jobs("--batch-size", "25", env=env),
        processes.run_jobs("--batch-size", "50", "--concurrency", "2", env=env),
    ]
    # Jobs only once every worker process of the three is registered: a loaded machine
    # may start one late, and the others would drain it all before it looked.
    running = WorkerProcess.objects.exclude(role=WorkerProcess.Role.SUPERVISOR)
    wait_until(lambda: running.count() == 4)
    enqueue_many({"task": jobs.record, "args": [f"job-{i}"]} for i in range(total))
    wait_until(lambda: Execution.objects.count() >= total, timeout=300)
    for proc in workers:
        proc.send_signal(signal.SIGTERM)
    for proc in workers:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, out
    runs = Counter(Execution.objects.values_list("key", flat=True))
    assert len(runs) == total, "every job ran"
    assert max(runs.values()) == 1, "no job ran twice"
    assert Job.objects.filter(status=Job.Status.DONE).count() == total
    owners = Counter(Job.objects.values_list("owner", flat=True))
    assert len(owners) >= 3, f"the work was shared between processes: {owners}"
    assert len(set(Execution.objects.values_list("pid", flat=True))) >= 3


def test_demo_style_run_jobs_with_concurrency_reports_totals(
    processes: Processes, worker_env: Callable[..., dict[str, str]]
) -> None:
    enqueue_many({"task": jobs.add, "args": [i, i]} for i in range(400))
    enqueue_many([{"task": jobs.fail, "max_attempts": 1}])
    proc = processes.run_jobs("--burst", "--concurrency", "2", env=worker_env())
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert "Finished: 400 done, 1 failed, 0 retried" in out
    assert Job.objects.filter(status=Job.Status.DONE).count() == 400
