"""``@job async def`` in the worker: an event loop per process (``--async-concurrency``)
beside the sync jobs, with timeouts, cancellations, leases and crash isolation
(docs/async.md). Real workers, real processes, real signals."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.test import override_settings

from django_dbqueue import enqueue, enqueue_many
from django_dbqueue.checks import check_task_settings
from django_dbqueue.models import Job
from django_dbqueue.models import WorkerProcess as WorkerRow
from django_dbqueue.worker.loop import Worker
from testproject.models import Execution
from tests.support import Processes, jobs, wait_until

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("async_connections"),
]
EnvMaker = Callable[..., dict[str, str]]

SETTINGS = {
    "LEASE_TIMEOUT": 600,  # only the supervisor's own settling frees a job in time
    "HEARTBEAT_INTERVAL": 0.3,
    "POLL_INTERVAL": 0.2,
    "KILL_GRACE": 1,
}


def status(job: Job) -> str:
    return Job.objects.get(pk=job.pk).status


def child_pid() -> int:
    wait_until(lambda: WorkerRow.objects.filter(role=WorkerRow.Role.CHILD).exists(), timeout=60)
    return WorkerRow.objects.get(role=WorkerRow.Role.CHILD).pid


# -- in this process ---------------------------------------------------------------------


@pytest.mark.parametrize(("threads", "async_concurrency"), [(1, 0), (1, 4), (3, 4)])
def test_async_and_sync_jobs_run_side_by_side_in_one_worker(
    threads: int, async_concurrency: int
) -> None:
    """With a loop (4) and without one (0: each async job on a loop of its own), beside
    the main thread or three threads."""
    batch = enqueue_many(
        [{"task": jobs.async_add, "args": [i, 1]} for i in range(6)]
        + [{"task": jobs.add, "args": [i, 2]} for i in range(3)]
        + [{"task": jobs.async_record, "args": [f"r{i}"]} for i in range(3)]
    )
    worker = Worker(
        burst=True, handle_signals=False, threads=threads, async_concurrency=async_concurrency
    )
    stats = worker.run()
    assert stats.done == len(batch)
    results = {job.pk: Job.objects.get(pk=job.pk).result for job in batch}
    assert [results[job.pk] for job in batch[:6]] == [i + 1 for i in range(6)]
    assert [results[job.pk] for job in batch[6:9]] == [i + 2 for i in range(3)]
    assert sorted(Execution.objects.values_list("key", flat=True)) == ["r0", "r1", "r2"]
    assert not Job.objects.exclude(status=Job.Status.DONE).exists()
    # The worker's timer thread (its executor's, or the inner one's under a loop) ended
    # with it: one left running held a connection past the test run.
    assert not [t.name for t in threading.enumerate() if t.name == f"{worker.name}-timer"]


@pytest.mark.parametrize("async_concurrency", [0, 4])
def test_an_async_job_past_its_timeout_fails_as_a_timeout(async_concurrency: int) -> None:
    slow = enqueue(jobs.async_sleep, [60], timeout=0.5, max_attempts=1)
    fine = enqueue(jobs.async_add, [1, 2])
    Worker(burst=True, handle_signals=False, async_concurrency=async_concurrency).run()
    slow.refresh_from_db()
    assert slow.status == Job.Status.FAILED
    assert "timeout of 0.5 s" in slow.last_error
    assert slow.errors[-1]["exception_class_path"] == "django_dbqueue.exceptions.JobTimeout"
    assert Job.objects.get(pk=fine.pk).result == 3


def test_a_jobs_own_timeout_error_and_system_exit_are_its_failures() -> None:
    own = enqueue(jobs.async_raise, ["timeout"], max_attempts=1)
    leaving = enqueue(jobs.async_raise, ["exit"], max_attempts=1)
    fine = enqueue(jobs.async_add, [2, 2])
    stats = Worker(burst=True, handle_signals=False, async_concurrency=4).run()
    assert (stats.done, stats.failed) == (1, 2)
    own.refresh_from_db()
    assert "the job's own timeout" in own.last_error and "JobTimeout" not in own.last_error
    leaving.refresh_from_db()
    assert leaving.status == Job.Status.FAILED and "SystemExit" in leaving.last_error
    assert Job.objects.get(pk=fine.pk).result == 4


def test_a_stray_task_raising_system_exit_stops_neither_the_loop_nor_other_jobs() -> None:
    stray = enqueue(jobs.async_stray_exit)
    other = enqueue(jobs.async_sleep, [0.3])
    stats = Worker(burst=True, handle_signals=False, async_concurrency=4).run()
    assert stats.done == 2
    assert Job.objects.get(pk=stray.pk).result == "survived"
    assert Job.objects.get(pk=other.pk).result == 0.3


def test_a_worker_stopped_before_it_started_closes_its_loop() -> None:
    worker = Worker(handle_signals=False, async_concurrency=3)
    assert worker.executor.lanes == 4 and worker.slot.lanes == 4
    worker.executor.join()
    assert worker.executor.unstarted() == []


def test_async_concurrency_is_checked_by_the_system_check_and_run_jobs() -> None:
    with override_settings(DBQUEUE={**settings.DBQUEUE, "ASYNC_CONCURRENCY": -1}):
        assert "django_dbqueue.E407" in [error.id for error in check_task_settings()]
    with override_settings(DBQUEUE={**settings.DBQUEUE, "ASYNC_CONCURRENCY": 8}):
        assert check_task_settings() == []
    with pytest.raises(CommandError, match="must be at least 0, got -1"):
        call_command("run_jobs", "--async-concurrency", "-1")
    assert not Job.objects.exists()


def test_an_async_job_held_longer_than_its_lease_runs_once() -> None:
    """The heartbeat renews the leases of async jobs as it does of the others."""
    job = enqueue(jobs.async_record, ["long", 2.5])
    short = {**settings.DBQUEUE, "LEASE_TIMEOUT": 1.0, "HEARTBEAT_INTERVAL": 0.2}
    with override_settings(DBQUEUE=short):
        Worker(burst=True, handle_signals=False, async_concurrency=2).run()
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Job.Status.DONE, 1)
    assert Execution.objects.filter(key="long").count() == 1


# -- run_jobs ----------------------------------------------------------------------------


@pytest.mark.processes
def test_200_async_jobs_reach_50_at_once_in_one_process(
    processes: Processes, worker_env: EnvMaker
) -> None:
    """The issue's measure: 200 jobs of 0.1 s, 1 process, --async-concurrency 50. Each
    job waits (a barrier, at most a minute) until 50 of them ran at once in its process."""
    batch = enqueue_many({"task": jobs.async_crowd, "args": [50, 0.1]} for _ in range(200))
    proc = processes.run_jobs(
        "--async-concurrency", "50", "--burst", env=worker_env(POLL_INTERVAL=0.2)
    )
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
    done = Job.objects.filter(pk__in=[job.pk for job in batch], status=Job.Status.DONE)
    assert done.count() == 200
    assert done.filter(attempts=1).count() == 200
    assert max(done.values_list("result", flat=True)) == 50, "50 ran at once, never more"
    first = min(done.values_list("started_at", flat=True))
    last = max(done.values_list("finished_at", flat=True))
    print(f"drain: 200 async jobs of 0.1 s in {(last - first).total_seconds():.2f} s")


@pytest.mark.processes
def test_cancelling_a_running_async_job_cancels_its_task_only(
    processes: Processes, worker_env: EnvMaker, tmp_path: Path
) -> None:
    gate = str(tmp_path / "gate")
    siblings = enqueue_many(
        {"task": jobs.async_hold_until, "args": [gate, f"s{i}"]} for i in range(3)
    )
    target = enqueue(jobs.async_hold_until, [str(tmp_path / "never"), "target"])
    sync_job = enqueue(jobs.record, ["sync"])
    proc = processes.run_jobs("--async-concurrency", "8", env=worker_env(CLAIM_AHEAD=0, **SETTINGS))
    first = child_pid()
    wait_until(lambda: Execution.objects.filter(key__in=["target", "s0", "s1", "s2"]).count() == 4)
    Job.objects.filter(pk=target.pk).cancel()
    wait_until(lambda: status(target) == Job.Status.CANCELLED, timeout=30)
    assert "cancelled by an operator while running" in Job.objects.get(pk=target.pk).last_error
    Path(gate).touch()
    ids = [job.pk for job in siblings] + [sync_job.pk]
    wait_until(lambda: Job.objects.filter(pk__in=ids, status="done").count() == 4, timeout=60)
    assert not Job.objects.filter(pk__in=ids, attempts__gt=1).exists()
    assert child_pid() == first, "no kill was needed"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0


@pytest.mark.processes
def test_an_async_job_blocking_the_loop_past_its_timeout_kills_only_its_process(
    processes: Processes, worker_env: EnvMaker
) -> None:
    """No asyncio timeout reaches a coroutine that never awaits: the supervisor kills the
    process; the jobs of the other lanes go back uncharged and run again."""
    siblings = enqueue_many({"task": jobs.async_record, "args": [f"b{i}", 2.0]} for i in range(3))
    proc = processes.run_jobs("--async-concurrency", "4", env=worker_env(CLAIM_AHEAD=0, **SETTINGS))
    first = child_pid()
    # After the siblings started: the blocker freezes them mid-sleep.
    wait_until(lambda: Job.objects.filter(status=Job.Status.CLAIMED).count() == 3)
    time.sleep(0.3)
    bad = enqueue(jobs.async_block, [60], timeout=1, max_attempts=1)
    wait_until(lambda: status(bad) == Job.Status.FAILED, timeout=60)
    bad.refresh_from_db()
    assert "JobTimeout" in bad.last_error and "SIGKILL" in bad.last_error
    ids = [job.pk for job in siblings]
    wait_until(lambda: Job.objects.filter(pk__in=ids, status="done").count() == 3, timeout=60)
    for job in siblings:
        assert Execution.objects.filter(key=job.args[0]).count() == 1
    assert child_pid() != first, "the child was killed and replaced"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0


@pytest.mark.processes
def test_second_sigterm_cancels_every_running_async_job_and_records_each(
    processes: Processes, worker_env: EnvMaker, tmp_path: Path
) -> None:
    held = enqueue_many(
        {"task": jobs.async_hold_until, "args": [str(tmp_path / "never"), f"h{i}"]}
        for i in range(3)
    )
    proc = processes.run_jobs("--async-concurrency", "4", env=worker_env(CLAIM_AHEAD=0, **SETTINGS))
    wait_until(lambda: Execution.objects.count() == 3)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    for job in held:
        job.refresh_from_db()
        assert job.attempts == 1, out
        assert "stopped by a second signal" in job.errors[-1]["traceback"], job.errors
    assert not Job.objects.filter(status=Job.Status.CLAIMED).exists()
