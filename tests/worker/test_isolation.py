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
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from django_dbqueue import enqueue, enqueue_many
from django_dbqueue.models import Job
from django_dbqueue.models import WorkerProcess as WorkerRow
from testproject.models import Execution
from tests.support import Processes, jobs, wait_until
from tests.worker import hostile

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]
EnvMaker = Callable[..., dict[str, str]]
# A lease long enough that only the supervisor's own settling can free a job in time.
# CLAIM_AHEAD 0: each claim takes the whole batch, so a hostile job has batch-mates
# (finished, unstarted) whatever the worker has measured of job times.
LONG_LEASE = {
    "LEASE_TIMEOUT": 600,
    "HEARTBEAT_INTERVAL": 0.3,
    "POLL_INTERVAL": 0.2,
    "CLAIM_AHEAD": 0,
}


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
    out, _ = proc.communicate(timeout=60)  # type: ignore[attr-defined]
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


def test_job_that_exits_the_process_fails_alone(processes: Processes, worker_env: EnvMaker) -> None:
    crash_until_failed(processes, worker_env, hostile.exit_hard, "exited with code 1")


def test_job_that_segfaults_fails_alone(processes: Processes, worker_env: EnvMaker) -> None:
    crash_until_failed(processes, worker_env, hostile.segfault, "was killed by signal 11 (SIGSEGV)")


def survive_exception(processes: Processes, worker_env: EnvMaker, task: object, named: str) -> None:
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


def test_keyboard_interrupt_is_a_failed_attempt(processes: Processes, worker_env: EnvMaker) -> None:
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
    job = enqueue(hostile.hold_gil, [2.5 * lease])
    first = processes.run_jobs(env=env)
    wait_until(lambda: WorkerRow.objects.filter(running_job_id=job.pk).exists(), timeout=30)
    # Recovers expired leases every heartbeat, and would take the job if it expired.
    second = processes.run_jobs(env=env)
    # Past Django's start-up before the stop signal, which would end it unhandled.
    wait_until(lambda: WorkerRow.objects.filter(pid=second.pid).exists(), timeout=30)
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


def test_sigkill_of_the_supervisor_takes_its_children_and_lease_recovery_takes_over(
    processes: Processes, worker_env: EnvMaker, tmp_path: Path
) -> None:
    env = worker_env(LEASE_TIMEOUT=2, HEARTBEAT_INTERVAL=0.3, POLL_INTERVAL=0.2, CLAIM_AHEAD=0)
    gate = tmp_path / "gate"
    running = enqueue(jobs.hold_until, [str(gate), "long"])
    waiting = enqueue_many({"task": jobs.record, "args": [f"w{i}"]} for i in range(3))
    victim = processes.run_jobs("--concurrency", "2", "--batch-size", "10", env=env)
    wait_until(lambda: WorkerRow.objects.filter(running_job_id=running.pk).exists(), timeout=30)
    pids = [row.pid for row in children()]
    assert len(pids) == 2
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    wait_until(lambda: all(pid_gone(pid) for pid in pids), timeout=5, interval=0.02)
    claimed = Job.objects.filter(status=Job.Status.CLAIMED)
    assert claimed.count() == 4, "left to lease recovery"
    # Nobody renews the leases now; a --burst run recovers them once they have expired.
    wait_until(
        lambda: claimed.filter(owner_date__lt=timezone.now() - timedelta(seconds=2)).count() == 4,
        timeout=10,
    )
    gate.touch()  # the rerun returns at once (the killed run held until it died)
    rescuer = processes.run_jobs("--burst", env=env)
    out, _ = rescuer.communicate(timeout=60)
    assert rescuer.returncode == 0, out
    # The running job was charged its attempt and ran again; the ones that were waiting
    # in the same batch were not charged and ran once.
    running.refresh_from_db()
    assert (running.status, running.attempts) == (Job.Status.DONE, 2)
    assert Execution.objects.filter(key="long").count() == 2, "the killed run and the rerun"
    assert "stopped renewing its lease while running this job" in running.last_error
    for job in waiting:
        job.refresh_from_db()
        assert (job.status, job.attempts) == (Job.Status.DONE, 1)
        assert "before it started this job (attempt not counted)" in job.last_error
        assert Execution.objects.filter(key=job.args[0]).count() == 1


def test_cancelled_job_stuck_in_c_is_killed_after_the_grace(
    processes: Processes, worker_env: EnvMaker
) -> None:
    stuck = enqueue(hostile.stuck_in_c)
    after = enqueue(jobs.add, [2, 2])
    proc = processes.run_jobs("--batch-size", "10", env=worker_env(**LONG_LEASE, KILL_GRACE=1))
    wait_until(lambda: WorkerRow.objects.filter(running_job_id=stuck.pk).exists(), timeout=30)
    asked = time.monotonic()
    assert Job.objects.filter(pk=stuck.pk).cancel() == (0, 1), "asked, not yet stopped"
    wait_until(lambda: Job.objects.get(pk=stuck.pk).status == Job.Status.CANCELLED, timeout=30)
    # Noticed at the next heartbeat (0.3 s), SIGUSR1 cannot stop C code, SIGKILL 1 s later.
    assert time.monotonic() - asked < 0.3 + 1 + 2.0
    wait_until(lambda: Job.objects.get(pk=after.pk).status == Job.Status.DONE, timeout=30)
    stop(proc)
    stuck.refresh_from_db()
    assert "was cancelled by an operator" in stuck.last_error
    assert "killed its worker process" in stuck.last_error
    assert stuck.attempts == 1


def test_two_sigterms_stop_run_jobs_within_the_grace_even_in_c_code(
    processes: Processes, worker_env: EnvMaker
) -> None:
    stuck = enqueue(hostile.stuck_in_c)
    waiting = enqueue(jobs.add, [1, 1])
    grace = 1.0
    proc = processes.run_jobs(
        "--concurrency", "2", "--batch-size", "10", env=worker_env(**LONG_LEASE, KILL_GRACE=grace)
    )
    wait_until(lambda: WorkerRow.objects.filter(running_job_id=stuck.pk).exists(), timeout=30)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert proc.poll() is None, "the first signal waits for the running job"
    proc.send_signal(signal.SIGTERM)
    second = time.monotonic()
    out, _ = proc.communicate(timeout=30)
    # The job would run for minutes: ending this soon, it was killed. (The margin is for
    # a loaded machine, where settling and exiting took 4.6 s.)
    assert time.monotonic() - second < grace + 10.0, out
    assert proc.returncode == 0, out
    stuck.refresh_from_db()
    assert (stuck.status, stuck.attempts) == (Job.Status.QUEUED, 1), "retried later, not lost"
    assert "WorkerShutdown: run_jobs was stopped by a second signal" in stuck.last_error
    waiting.refresh_from_db()
    # The stuck child claimed it too. Handed back at the stop, it is queued and uncharged;
    # if the stop came later than STALE_AFTER (a loaded machine), the child handed it back
    # as stale and the other child ran it, once.
    ran_elsewhere = (waiting.status, waiting.attempts, waiting.result) == (Job.Status.DONE, 1, 2)
    assert ran_elsewhere or (waiting.status, waiting.attempts) == (Job.Status.QUEUED, 0)
    assert not WorkerRow.objects.exists()
    assert all(pid_gone(int(pid)) for pid in [proc.pid])


def test_burst_recovers_jobs_of_dead_workers_before_claiming(
    processes: Processes, worker_env: EnvMaker
) -> None:
    orphan = enqueue(jobs.record, ["orphan"])
    assert [job.pk for job in Job.objects.claim("gone-host:4242:dead00", 10)] == [orphan.pk]
    Job.objects.filter(pk=orphan.pk).update(owner_date=timezone.now() - timedelta(minutes=5))
    proc = processes.run_jobs("--burst", env=worker_env(LEASE_TIMEOUT=60))
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    orphan.refresh_from_db()
    assert orphan.status == Job.Status.DONE, out
    assert "Finished: 1 done" in out
    assert Execution.objects.filter(key="orphan").count() == 1


def test_max_jobs_is_shared_by_the_children_and_survives_a_crash(
    processes: Processes, worker_env: EnvMaker
) -> None:
    enqueue(hostile.exit_hard, max_attempts=1)
    enqueue_many({"task": jobs.record, "args": [f"x{i}"]} for i in range(10))
    proc = processes.run_jobs(
        "--concurrency", "2", "--batch-size", "2", "--max-jobs", "6", env=worker_env(**LONG_LEASE)
    )
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    # The crash counts as one of the six: five innocent jobs ran.
    assert Job.objects.filter(status=Job.Status.FAILED).count() == 1
    assert Job.objects.filter(status=Job.Status.DONE).count() == 5
    assert "Finished: 5 done, 1 failed, 0 retried" in out
    assert not Job.objects.filter(status=Job.Status.CLAIMED).exists()


def test_a_job_that_may_show_as_running_is_recorded_before_the_next_starts(
    processes: Processes, worker_env: EnvMaker
) -> None:
    # Lease recovery may uncharge the jobs after the one a dead worker's row names only
    # because of this: with finished jobs written every 60 s, the slow one is still
    # written before its successor starts.
    slow, after = enqueue_many(
        {"task": jobs.record, "args": [key], "kwargs": {"sleep": 1.0 if key == "s" else 2.0}}
        for key in ("s", "t")
    )
    env = worker_env(**LONG_LEASE, FINISH_FLUSH_INTERVAL=60)
    proc = processes.run_jobs("--batch-size", "10", env=env)
    wait_until(lambda: WorkerRow.objects.filter(running_job_id=after.pk).exists(), timeout=30)
    assert Job.objects.get(pk=slow.pk).status == Job.Status.DONE
    # Once it ends, the row names no job (within a supervisor tick or two).
    wait_until(lambda: Job.objects.get(pk=after.pk).status == Job.Status.DONE, timeout=30)
    ended = time.monotonic()
    child = WorkerRow.objects.filter(role=WorkerRow.Role.CHILD)
    wait_until(lambda: child.filter(running_job_id=None).exists(), timeout=5, interval=0.01)
    assert time.monotonic() - ended < 1.0
    stop(proc)
