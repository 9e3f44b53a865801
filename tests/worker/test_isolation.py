"""Hostile jobs cost nobody else anything: real run_jobs processes, real signals.

Each test puts one bad job in the middle of a batch of innocent ones (the three before it
have finished but may not be recorded yet when it strikes; the three after it have not
started) and checks what each of them ends up with.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from django_dbqueue import enqueue, enqueue_many
from django_dbqueue.models import Job
from django_dbqueue.models import WorkerProcess as WorkerRow
from testproject.models import Execution
from tests.support import Processes, jobs, wait_until
from tests.worker import hostile

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]
EnvMaker = Callable[..., dict[str, str]]
# A lease long enough that only the supervisor's own settling can free a job in time.
LONG_LEASE = {"LEASE_TIMEOUT": 600, "HEARTBEAT_INTERVAL": 0.3, "POLL_INTERVAL": 0.2}


def pid_gone(pid: int) -> bool:
    """The process has exited (a zombie waiting for a reaper counts as exited)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def children() -> list[WorkerRow]:
    return list(WorkerRow.objects.filter(role=WorkerRow.Role.CHILD))


def batch_around(task: object, **options: object) -> tuple[list[Job], Job]:
    """Three innocent jobs, the bad one, three more: claimed together as one batch."""
    before = enqueue_many({"task": jobs.record, "args": [f"before-{i}"]} for i in range(3))
    bad = enqueue(task, **options)  # type: ignore[arg-type]
    after = enqueue_many({"task": jobs.record, "args": [f"after-{i}"]} for i in range(3))
    return [*before, *after], bad


def assert_innocents_ran_once(innocents: list[Job]) -> None:
    for job in innocents:
        job.refresh_from_db()
        key = job.args[0]
        assert (job.status, job.attempts) == (Job.Status.DONE, 1), (key, job.last_error)
        assert Execution.objects.filter(key=key).count() == 1, key
        assert job.last_error == ""


def stop(proc: object) -> None:
    proc.send_signal(signal.SIGTERM)  # type: ignore[attr-defined]
    out, _ = proc.communicate(timeout=30)  # type: ignore[attr-defined]
    assert proc.returncode == 0, out  # type: ignore[attr-defined]


def crash_until_failed(
    processes: Processes, worker_env: EnvMaker, task: object, named: str
) -> None:
    innocents, bad = batch_around(task, max_attempts=3, retry_backoff=0.1)
    proc = processes.run_jobs(
        "--concurrency", "2", "--batch-size", "10", env=worker_env(**LONG_LEASE)
    )
    wait_until(lambda: Job.objects.get(pk=bad.pk).status == Job.Status.FAILED, timeout=60)
    wait_until(lambda: Job.objects.filter(status=Job.Status.DONE).count() == 6, timeout=30)
    stop(proc)
    assert_innocents_ran_once(innocents)
    bad.refresh_from_db()
    assert bad.attempts == 3
    assert len(bad.errors) == 3
    for error in bad.errors:
        assert named in error["traceback"], error
        assert "while running this job" in error["traceback"]
        assert error["exception_class_path"] == "django_dbqueue.worker.deaths.WorkerDied"
    assert named in bad.last_error
    assert not Job.objects.filter(status=Job.Status.CLAIMED).exists()


def test_job_that_exits_the_process_fails_alone(
    processes: Processes, worker_env: EnvMaker
) -> None:
    crash_until_failed(processes, worker_env, hostile.exit_hard, "exited with code 1")


def test_job_that_segfaults_fails_alone(processes: Processes, worker_env: EnvMaker) -> None:
    crash_until_failed(
        processes, worker_env, hostile.segfault, "was killed by signal 11 (SIGSEGV)"
    )


def survive_exception(
    processes: Processes, worker_env: EnvMaker, task: object, named: str
) -> None:
    innocents, bad = batch_around(task, max_attempts=1)
    proc = processes.run_jobs("--batch-size", "10", env=worker_env(**LONG_LEASE))
    wait_until(lambda: len(children()) == 1, timeout=30)
    child = children()[0]
    wait_until(lambda: Job.objects.filter(status=Job.Status.DONE).count() == 6, timeout=30)
    bad.refresh_from_db()
    assert (bad.status, bad.attempts) == (Job.Status.FAILED, 1)
    assert named in bad.last_error and "Traceback" in bad.last_error
    assert [row.pid for row in children()] == [child.pid], "the same process carried on"
    stop(proc)
    assert_innocents_ran_once(innocents)


def test_system_exit_is_a_failed_attempt(processes: Processes, worker_env: EnvMaker) -> None:
    survive_exception(processes, worker_env, hostile.raise_system_exit, "SystemExit: 3")


def test_keyboard_interrupt_is_a_failed_attempt(
    processes: Processes, worker_env: EnvMaker
) -> None:
    survive_exception(processes, worker_env, hostile.raise_keyboard_interrupt, "KeyboardInterrupt")


def test_other_base_exception_is_a_failed_attempt(
    processes: Processes, worker_env: EnvMaker
) -> None:
    survive_exception(
        processes,
        worker_env,
        hostile.raise_base_exception,
        "NotAnException: a BaseException of the job's own",
    )


def test_job_stuck_in_c_past_its_timeout_is_killed_within_the_grace(
    processes: Processes, worker_env: EnvMaker
) -> None:
    timeout, grace = 2.0, 1.0
    innocents, bad = batch_around(hostile.stuck_in_c, max_attempts=1, timeout=timeout)
    proc = processes.run_jobs(
        "--concurrency",
        "2",
        "--batch-size",
        "10",
        env=worker_env(**LONG_LEASE, KILL_GRACE=grace),
    )
    wait_until(lambda: Job.objects.get(pk=bad.pk).status == Job.Status.FAILED, timeout=30)
    wait_until(lambda: Job.objects.filter(status=Job.Status.DONE).count() == 6, timeout=30)
    stop(proc)
    assert_innocents_ran_once(innocents)
    bad.refresh_from_db()
    assert bad.attempts == 1
    assert bad.started_at is not None and bad.finished_at is not None
    took = (bad.finished_at - bad.started_at).total_seconds()
    # Killed on the supervisor's first 0.2 s tick past timeout + grace; slack for load.
    assert timeout + grace <= took < timeout + grace + 2.0, took
    assert "JobTimeout" in bad.last_error and "timeout of 2 s" in bad.last_error
    assert "SIGKILL" in bad.last_error
    assert bad.errors[-1]["exception_class_path"] == "django_dbqueue.exceptions.JobTimeout"


def test_job_ignoring_sigalrm_past_its_timeout_is_killed(
    processes: Processes, worker_env: EnvMaker
) -> None:
    job = enqueue(hostile.ignore_alarm, [60], max_attempts=1, timeout=0.5)
    after = enqueue(jobs.add, [1, 2])
    proc = processes.run_jobs(env=worker_env(**LONG_LEASE, KILL_GRACE=0.5))
    wait_until(lambda: Job.objects.get(pk=after.pk).status == Job.Status.DONE, timeout=30)
    stop(proc)
    job.refresh_from_db()
    assert job.status == Job.Status.FAILED
    assert "timeout of 0.5 s" in job.last_error


def test_job_holding_the_gil_past_its_lease_runs_once(
    processes: Processes, worker_env: EnvMaker
) -> None:
    lease = 1.5
    env = worker_env(LEASE_TIMEOUT=lease, HEARTBEAT_INTERVAL=0.3, POLL_INTERVAL=0.2)
    job = enqueue(hostile.hold_gil, [27])
    first = processes.run_jobs(env=env)
    wait_until(lambda: WorkerRow.objects.filter(running_job_id=job.pk).exists(), timeout=30)
    # Recovers expired leases every heartbeat, and would take the job if it expired.
    second = processes.run_jobs(env=env)
    wait_until(lambda: Job.objects.get(pk=job.pk).status == Job.Status.DONE, timeout=120)
    job.refresh_from_db()
    owner = WorkerRow.objects.get(name=job.owner)
    assert WorkerRow.objects.get(name=owner.supervisor).pid == first.pid, "never taken over"
    stop(first)
    stop(second)
    assert job.result > lease * 2, "the test needs a job holding the GIL well past the lease"
    assert job.attempts == 1
    assert job.last_error == ""


def test_sigkill_of_a_child_mid_batch_frees_its_batch_at_once(
    processes: Processes, worker_env: EnvMaker
) -> None:
    batch = enqueue_many(
        {"task": jobs.record, "args": [f"m{i}"], "kwargs": {"sleep": 2.0}} for i in range(6)
    )
    proc = processes.run_jobs("--batch-size", "10", env=worker_env(**LONG_LEASE))
    first = batch[0]
    wait_until(lambda: WorkerRow.objects.filter(running_job_id=first.pk).exists(), timeout=30)
    victim = WorkerRow.objects.get(running_job_id=first.pk)
    assert Job.objects.filter(owner=victim.name, status=Job.Status.CLAIMED).count() == 6
    killed = time.monotonic()
    os.kill(victim.pid, signal.SIGKILL)
    held = Job.objects.filter(owner=victim.name, status=Job.Status.CLAIMED)
    wait_until(lambda: not held.exists(), timeout=10, interval=0.01)
    freed_in = time.monotonic() - killed
    assert freed_in < 1.0, freed_in
    first.refresh_from_db()
    assert first.attempts == 1 and "killed by signal 9 (SIGKILL)" in first.last_error
    for job in batch[1:]:
        job.refresh_from_db()
        assert job.attempts <= 1, "unstarted: given back, attempt not counted"
        assert job.status in (Job.Status.QUEUED, Job.Status.CLAIMED)
    wait_until(lambda: Job.objects.filter(status=Job.Status.DONE).count() == 6, timeout=60)
    stop(proc)
    assert list(Job.objects.values_list("attempts", flat=True).order_by("id")) == [2] + [1] * 5
    assert all(Execution.objects.filter(key=f"m{i}").count() == 1 for i in range(6))
