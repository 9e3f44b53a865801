"""Crashes, signals, retries, timeouts and database outages, with real worker processes."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import OperationalError, connection
from django.utils import timezone

from django_dbqueue import enqueue, enqueue_many
from django_dbqueue.models import Job
from django_dbqueue.models import WorkerProcess as WorkerRow
from django_dbqueue.worker.loop import Worker
from testproject.models import Execution
from tests.support import CURRENT_VENDOR, Processes, jobs, wait_until, writes_held_off

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]
FAST = {"LEASE_TIMEOUT": 3, "HEARTBEAT_INTERVAL": 0.5, "POLL_INTERVAL": 0.2}
EnvMaker = Callable[..., dict[str, str]]


def status(job: Job) -> str:
    return Job.objects.get(pk=job.pk).status


def runs(key: str) -> int:
    return Execution.objects.filter(key=key).count()


def test_sigkill_mid_job_the_job_completes_later(
    processes: Processes, worker_env: EnvMaker
) -> None:
    env = worker_env(**FAST)
    job = enqueue(jobs.record, ["killed"], {"sleep": 2.0})
    victim = processes.run_jobs(env=env)
    # The supervisor shows the running job in its child's row once it has run 0.5 s;
    # that row is how lease recovery knows this job was running, not waiting.
    wait_until(lambda: WorkerRow.objects.filter(running_job_id=job.pk).exists(), timeout=30)
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    assert runs("killed") == 0 and status(job) == Job.Status.CLAIMED
    rescuer = processes.run_jobs(env=env)
    wait_until(lambda: status(job) == Job.Status.DONE, timeout=30)
    rescuer.send_signal(signal.SIGTERM)
    assert rescuer.wait(20) == 0
    job.refresh_from_db()
    assert runs("killed") == 1
    assert job.attempts == 2, "the crashed attempt counts"
    assert "stopped renewing its lease" in job.last_error


def test_slow_job_of_a_live_worker_is_never_recovered(
    processes: Processes, worker_env: EnvMaker, tmp_path: Path
) -> None:
    env = worker_env(LEASE_TIMEOUT=1.5, HEARTBEAT_INTERVAL=0.3, POLL_INTERVAL=0.2)
    # Both running before the job is (a slow start on a busy machine would prove
    # nothing): whichever runs it, the other recovers expired leases while it polls. The
    # job runs until the test opens its gate, four lease timeouts later.
    gate = tmp_path / "gate"
    first, second = processes.run_jobs(env=env), processes.run_jobs(env=env)
    wait_until(
        lambda: WorkerRow.objects.filter(role=WorkerRow.Role.CHILD).count() == 2, timeout=120
    )
    job = enqueue(jobs.hold_until, [str(gate), "slow"])
    wait_until(lambda: status(job) == Job.Status.CLAIMED, timeout=30)
    time.sleep(4 * 1.5)
    assert status(job) == Job.Status.CLAIMED
    gate.touch()
    wait_until(lambda: status(job) == Job.Status.DONE, timeout=30)
    for proc in (first, second):
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    job.refresh_from_db()
    assert runs("slow") == 1
    assert job.attempts == 1
    assert job.last_error == ""


def test_sigterm_hands_back_unstarted_jobs_at_once(
    processes: Processes, worker_env: EnvMaker
) -> None:
    # A long lease: the other worker may only get the jobs because they were handed back.
    # CLAIM_AHEAD 0: the first claim takes all six, not the one job a new worker would.
    env = worker_env(LEASE_TIMEOUT=600, HEARTBEAT_INTERVAL=1, CLAIM_AHEAD=0)
    batch = enqueue_many(
        {"task": jobs.record, "args": [f"t{i}"], "kwargs": {"sleep": 1.0}} for i in range(6)
    )
    first = processes.run_jobs("--batch-size", "10", env=env)
    wait_until(lambda: Job.objects.filter(status=Job.Status.CLAIMED).count() == 6, timeout=30)
    time.sleep(0.3)
    first.send_signal(signal.SIGTERM)
    out, _ = first.communicate(timeout=20)
    assert first.returncode == 0, out
    assert not WorkerRow.objects.exists(), "the worker deregistered"
    queued = Job.objects.filter(status=Job.Status.QUEUED)
    assert queued.count() >= 4
    assert set(queued.values_list("attempts", flat=True)) == {0}, "not counted as attempts"
    assert Job.objects.filter(status=Job.Status.CLAIMED).count() == 0
    second = processes.run_jobs("--burst", env=env)
    assert second.wait(60) == 0
    assert Job.objects.filter(status=Job.Status.DONE).count() == len(batch)
    assert all(runs(f"t{i}") == 1 for i in range(6))


def test_second_sigterm_stops_the_running_job_and_records_it(
    processes: Processes, worker_env: EnvMaker
) -> None:
    job = enqueue(jobs.sleep, [60])
    proc = processes.run_jobs(env=worker_env(**FAST))
    wait_until(lambda: status(job) == Job.Status.CLAIMED, timeout=30)
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert proc.poll() is None, "the first signal lets the job finish"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=15)
    assert proc.returncode == 0, out
    job.refresh_from_db()
    assert job.status == Job.Status.QUEUED, "retried later, not lost"
    assert "WorkerShutdown" in job.last_error
    assert job.attempts == 1


def test_a_stop_signal_while_starting_up_starts_no_children(
    processes: Processes, worker_env: EnvMaker
) -> None:
    # The supervisor's first write (its row) waits behind a lock while the signal comes;
    # before the fix, it went on to start children that never heard of the stop.
    job = enqueue(jobs.record, ["never"])
    with writes_held_off(WorkerRow):
        proc = processes.run_jobs("--concurrency", "2", env=worker_env(**FAST))
        assert proc.stdout is not None
        assert "Running jobs from" in proc.stdout.readline()  # its handlers are in place
        time.sleep(1.0)
        assert proc.poll() is None, "waiting for its row"
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert status(job) == Job.Status.QUEUED and runs("never") == 0
    assert not WorkerRow.objects.exists(), "it deregistered"


def test_always_failing_job_ends_failed_after_max_attempts_with_backoff(
    processes: Processes, worker_env: EnvMaker
) -> None:
    job = enqueue(jobs.fail_then_record, ["flaky"], max_attempts=3, retry_backoff=0.5)
    proc = processes.run_jobs(env=worker_env(**{**FAST, "MIN_POLL_INTERVAL": 0.02}))
    wait_until(lambda: status(job) == Job.Status.FAILED, timeout=30)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
    job.refresh_from_db()
    times = list(
        Execution.objects.filter(key="flaky").order_by("id").values_list("created_at", flat=True)
    )
    assert len(times) == 3 and job.attempts == 3
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
    assert gaps[0] >= 0.5 * 0.8 - 0.05, gaps  # 0.5 s +/- 20% jitter
    assert gaps[1] >= 1.0 * 0.8 - 0.05, gaps  # doubled
    assert len(job.errors) == 3
    assert "RuntimeError: attempt for flaky failed" in job.last_error


def test_job_past_its_timeout_is_stopped_and_the_worker_goes_on() -> None:
    slow = enqueue(jobs.sleep, [30], timeout=0.5, max_attempts=1)
    after = enqueue(jobs.add, [1, 2])
    started = time.monotonic()
    Worker(burst=True).run()
    assert time.monotonic() - started < 10
    slow.refresh_from_db()
    assert slow.status == Job.Status.FAILED
    assert "JobTimeout" in slow.last_error and "0.5 s" in slow.last_error
    assert Job.objects.get(pk=after.pk).result == 3


def test_retry_job_defers_without_counting_an_attempt() -> None:
    job = enqueue(jobs.retry_once, ["later"], max_attempts=1)
    Worker(burst=True, handle_signals=False).run()
    job.refresh_from_db()
    assert job.status == Job.Status.QUEUED and job.attempts == 0
    assert "come back later" in job.last_error
    assert job.run_after > timezone.now() - timedelta(seconds=1)
    time.sleep(0.4)
    Worker(burst=True, handle_signals=False).run()
    job.refresh_from_db()
    assert (job.status, job.result, job.attempts) == (Job.Status.DONE, "later", 1)


def test_operator_cancels_a_running_job(processes: Processes, worker_env: EnvMaker) -> None:
    running = enqueue(jobs.sleep, [60])
    after = enqueue(jobs.add, [2, 2])
    proc = processes.run_jobs("--batch-size", "1", env=worker_env(**FAST))
    wait_until(lambda: status(running) == Job.Status.CLAIMED, timeout=30)
    Job.objects.filter(pk=running.pk).update(cancel_requested=True)
    wait_until(lambda: status(running) == Job.Status.CANCELLED, timeout=10)
    wait_until(lambda: status(after) == Job.Status.DONE, timeout=10)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
    assert "cancelled by an operator" in Job.objects.get(pk=running.pk).last_error


def test_supervisor_replaces_a_dead_child_and_stops_cleanly(
    processes: Processes, worker_env: EnvMaker
) -> None:
    proc = processes.run_jobs("--concurrency", "2", env=worker_env(**FAST))
    children = WorkerRow.objects.filter(role=WorkerRow.Role.CHILD)
    wait_until(lambda: children.count() == 2, timeout=30)
    supervisor = WorkerRow.objects.get(role=WorkerRow.Role.SUPERVISOR)
    assert supervisor.pid == proc.pid
    first_pids = set(children.values_list("pid", flat=True))
    assert set(children.values_list("supervisor", flat=True)) == {supervisor.name}
    victim = min(first_pids)
    os.kill(victim, signal.SIGKILL)
    wait_until(
        lambda: len(set(children.values_list("pid", flat=True)) - first_pids) == 1,
        timeout=30,
    )
    assert victim not in set(children.values_list("pid", flat=True)), "its row went with it"
    enqueue_many({"task": jobs.record, "args": [f"s{i}"]} for i in range(50))
    wait_until(lambda: Job.objects.filter(status=Job.Status.DONE).count() == 50, timeout=30)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert not WorkerRow.objects.exists(), "the supervisor and its children deregistered"


def _kill_other_sessions() -> int:
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute(
                "SELECT ID FROM information_schema.PROCESSLIST "
                "WHERE DB = DATABASE() AND ID <> CONNECTION_ID()"
            )
            ids = [row[0] for row in cursor.fetchall()]
            for session in ids:
                cursor.execute("KILL %s", [session])
            return len(ids)
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return int(cursor.fetchone()[0])


@pytest.mark.only_vendor("mysql", "postgresql")
def test_idle_worker_survives_its_connections_being_killed(
    processes: Processes, worker_env: EnvMaker
) -> None:
    proc = processes.run_jobs(env=worker_env(**FAST))
    wait_until(lambda: WorkerRow.objects.exists(), timeout=30)
    time.sleep(1.5)  # idle, heartbeating
    assert _kill_other_sessions() >= 1
    enqueue_many({"task": jobs.record, "args": [f"i{i}"]} for i in range(20))
    wait_until(lambda: Job.objects.filter(status=Job.Status.DONE).count() == 20, timeout=30)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
    assert Execution.objects.count() == 20


@pytest.mark.only_vendor("mysql", "postgresql")
def test_lock_wait_timeout_when_recording_is_retried() -> None:
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute("SET SESSION innodb_lock_wait_timeout = 1")
        else:
            cursor.execute("SET lock_timeout = '1s'")
    job = enqueue(jobs.lock_own_row_then_return, kwargs={"job_id": 0, "hold": 2.5}, max_attempts=1)
    Job.objects.filter(pk=job.pk).update(kwargs={"job_id": job.pk, "hold": 2.5})
    started = time.monotonic()
    Worker(burst=True, handle_signals=False).run()
    job.refresh_from_db()
    assert job.status == Job.Status.DONE
    assert job.result == "recorded after the lock was released"
    assert time.monotonic() - started >= 2.0, "the write waited out the other lock"


def _restart_database_server() -> None:
    if os.geteuid() != 0:
        raise AssertionError("restarting the database server needs root (as in CI)")
    if CURRENT_VENDOR == "mysql":
        subprocess.run(["mariadb-admin", "-h127.0.0.1", "-uroot", "shutdown"], check=True)
        time.sleep(1.5)
        subprocess.run(
            [
                "start-stop-daemon",
                "--start",
                "--oknodo",
                "--background",
                "--exec",
                "/usr/sbin/mariadbd",
            ],
            check=True,
        )
        ping = ["mariadb-admin", "-h127.0.0.1", "-uroot", "ping"]
    else:
        version = os.listdir("/etc/postgresql")[0]
        subprocess.run(
            [
                "pg_ctlcluster",
                "--skip-systemctl-redirect",
                version,
                "main",
                "restart",
                "-m",
                "fast",
            ],
            check=True,
        )
        ping = ["pg_isready", "-h", "127.0.0.1", "-p", "5432"]
    wait_until(
        lambda: subprocess.run(ping, capture_output=True).returncode == 0, timeout=60, interval=0.5
    )


def _done_count() -> int:
    try:
        return Job.objects.filter(status=Job.Status.DONE).count()
    except OperationalError:
        connection.close()
        return -1


@pytest.mark.server_restart
@pytest.mark.only_vendor("mysql", "postgresql")
def test_database_restart_during_a_drain_loses_and_duplicates_nothing(
    processes: Processes, worker_env: EnvMaker
) -> None:
    total = 3000
    enqueue_many(
        {"task": jobs.record, "args": [f"r{i}"], "max_attempts": 10, "retry_backoff": 0.2}
        for i in range(total)
    )
    env = worker_env(**FAST)
    workers = [processes.run_jobs("--batch-size", "20", env=env) for _ in range(2)]
    wait_until(lambda: _done_count() >= 300, timeout=60)
    _restart_database_server()
    connection.close()
    wait_until(lambda: _done_count() == total, timeout=120, interval=0.5)
    outputs = []
    for proc in workers:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out
        outputs.append(out)
    finished = sum(int(out.split("Finished: ")[1].split(" done")[0]) for out in outputs)
    assert finished == total, "each job finalized exactly once"
    counts = Counter(Execution.objects.values_list("key", flat=True))
    assert len(counts) == total, "no job lost"
    # At-least-once: a job may run again only if its first run failed (its write never
    # reached the server), which shows as a counted attempt.
    rerun = [key for key, n in counts.items() if n > 1]
    if rerun:
        attempts = dict(Job.objects.filter(args__0__in=rerun).values_list("args__0", "attempts"))
        assert all(attempts[key] > 1 for key in rerun), attempts
    assert any("database error" in out for out in outputs), "the outage was noticed"
