"""A project whose router reads every model from a replica, the queue's included, and a
replica that lags (its SQL thread stopped: it applies nothing the primary writes during
the test): every queue read that decides something must go to the primary (issue 26,
item 4; docs/databases.md, "Replicas"). Real `run_jobs` processes, real signals.

Each test also reads the replica itself, to show it really was behind while the worker
decided."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from django.db import connection

from django_dbqueue import enqueue, enqueue_many
from django_dbqueue.models import Job, ScheduleTick
from django_dbqueue.models import WorkerProcess as WorkerRow
from django_dbqueue.queue.pausing import pause
from testproject.models import Execution
from tests.support import ROOT, Processes, jobs, task_functions, wait_until
from tests.support.replica import ReplicaPair
from tests.worker import hostile

pytestmark = [pytest.mark.replica, pytest.mark.processes]

EnvMaker = Callable[..., dict[str, str]]
LONG_LEASE = 600  # s: a job settled within a test's timeout was not settled by its lease


def on_replica(pair: ReplicaPair, sql: str) -> int:
    """One number read from the replica's copy of the test database."""
    name = str(connection.settings_dict["NAME"])
    return int(pair.query(pair.replica, sql, database=name)[0][0])


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    return proc.communicate(timeout=60)[0]


def test_a_queue_paused_while_the_replica_lags_is_not_claimed(
    pair: ReplicaPair, replica_env: EnvMaker, processes: Processes
) -> None:
    with pair.lagging():
        assert pause("default", by="operator")
        held = enqueue_many({"task": jobs.record, "args": [f"held-{i}"]} for i in range(20))
        # Claimed after the 20 (same priority, later id): once it ran, they had their turn.
        enqueue(jobs.record, ["marker"], queue="emails")
        proc = processes.run_jobs(
            "--queue", "default", "--queue", "emails", env=replica_env(POLL_INTERVAL=0.2)
        )
        wait_until(lambda: Execution.objects.filter(key="marker").exists(), timeout=60)
        assert on_replica(pair, "SELECT COUNT(*) FROM dbqueue_queue WHERE paused") == 0
        assert on_replica(pair, "SELECT COUNT(*) FROM dbqueue_job") == 0
        stop(proc)
    assert not Execution.objects.exclude(key="marker").exists(), "0 of 20 ran after the pause"
    queued = Job.objects.filter(pk__in=[job.pk for job in held], status=Job.Status.QUEUED)
    assert queued.count() == 20


def kill_the_child(gate: Path) -> Callable[[], Job]:
    def enqueue_and_kill() -> Job:
        victim = enqueue(jobs.hold_until, [str(gate), "victim"], max_attempts=1)
        wait_until(lambda: Execution.objects.filter(key="victim").exists(), timeout=60)
        os.kill(Execution.objects.get(key="victim").pid, signal.SIGKILL)
        return victim

    return enqueue_and_kill


@pytest.mark.parametrize("death", ["os._exit", "SIGKILL"])
def test_a_child_that_dies_while_the_replica_lags_has_its_job_settled_at_once(
    pair: ReplicaPair, replica_env: EnvMaker, processes: Processes, tmp_path: Path, death: str
) -> None:
    env = replica_env(LEASE_TIMEOUT=LONG_LEASE, HEARTBEAT_INTERVAL=0.3)
    with pair.lagging():
        proc = processes.run_jobs("--concurrency", "1", env=env)
        if death == "os._exit":
            victim = enqueue(hostile.exit_hard, max_attempts=1)
        else:
            victim = kill_the_child(tmp_path / "never")()
        after = enqueue(jobs.record, ["after"])
        # Settled by the supervisor (the lease has LONG_LEASE s to run): failed, its only
        # attempt spent, and the next job runs in a new child.
        failed = Job.objects.filter(pk=victim.pk, status=Job.Status.FAILED)
        wait_until(failed.exists, timeout=60)
        wait_until(lambda: Job.objects.filter(pk=after.pk, status=Job.Status.DONE).exists())
        assert on_replica(pair, "SELECT COUNT(*) FROM dbqueue_job") == 0
        stop(proc)
    victim.refresh_from_db()
    assert victim.attempts == 1
    assert ("exited with code 1" if death == "os._exit" else "SIGKILL") in victim.last_error


def heartbeats() -> object:
    return WorkerRow.objects.order_by("-heartbeat_at").values_list("heartbeat_at", flat=True)[0]


def test_an_operators_cancel_while_the_replica_lags_is_seen_before_the_job_starts(
    pair: ReplicaPair, replica_env: EnvMaker, processes: Processes, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    env = replica_env(HEARTBEAT_INTERVAL=0.2, CLAIM_AHEAD=0, LEASE_TIMEOUT=LONG_LEASE)
    with pair.lagging():
        first = enqueue(jobs.hold_until, [str(gate), "first"])
        second = enqueue(jobs.record, ["second"])
        proc = processes.run_jobs("--concurrency", "1", "--batch-size", "10", env=env)
        wait_until(lambda: Execution.objects.filter(key="first").exists(), timeout=60)
        # Claimed in first's batch, waiting for its turn in the same child.
        assert Job.objects.get(pk=second.pk).status == Job.Status.CLAIMED
        assert Job.objects.filter(pk=second.pk).cancel() == (0, 1)
        # Two heartbeats after the cancel: the supervisor's relay (one primary read per
        # beat) has run since; then the child's own check before the start decides.
        for _ in range(2):
            seen = heartbeats()
            wait_until(lambda s=seen: heartbeats() != s, timeout=30)  # type: ignore[misc]
        assert on_replica(pair, "SELECT COUNT(*) FROM dbqueue_job WHERE cancel_requested") == 0
        gate.touch()
        wait_until(lambda: Job.objects.get(pk=second.pk).is_finished, timeout=60)
        stop(proc)
    assert not Execution.objects.filter(key="second").exists(), "it ran"
    assert Job.objects.get(pk=first.pk).status == Job.Status.DONE
    cancelled = Job.objects.get(pk=second.pk)
    assert cancelled.status == Job.Status.CANCELLED
    assert "before it started" in cancelled.last_error


EVERY_SECOND = {"tick": {"task": "tests.support.jobs.noop", "every": 1}}


def test_ticks_while_the_replica_lags_are_neither_missed_nor_duplicated(
    pair: ReplicaPair, replica_env: EnvMaker, processes: Processes
) -> None:
    env = replica_env(SCHEDULE=EVERY_SECOND, HEARTBEAT_INTERVAL=1)
    with pair.lagging():
        # Two hosts' supervisors. A tick read from the replica would look not enqueued
        # yet, and the unique index would still refuse it twice: this test guards the
        # whole (each second once, none missing), not the read alone.
        procs = [processes.run_jobs("-v", "0", env=env) for _ in range(2)]
        wait_until(lambda: ScheduleTick.objects.count() >= 6, timeout=60, interval=0.2)
        for proc in procs:
            stop(proc)
        assert on_replica(pair, "SELECT COUNT(*) FROM dbqueue_schedule_tick") == 0
    seconds = [int(t.timestamp()) for t in ScheduleTick.objects.values_list("tick_at", flat=True)]
    seconds.sort()
    assert seconds == list(range(seconds[0], seconds[0] + len(seconds)))
    ticks = ScheduleTick.objects.values_list("job_id", flat=True)
    assert len(set(ticks)) == len(seconds)
    assert Job.objects.filter(task="tests.support.jobs.noop").count() == len(seconds)


GET_RESULT = """
try:
    from django.tasks import default_task_backend
except ImportError:
    from django_tasks import default_task_backend
result = default_task_backend.get_result({id!r})
print(result.status, result.status == 'SUCCESSFUL' and result.return_value)
"""


def test_get_result_while_the_replica_lags_sees_the_finished_job(
    pair: ReplicaPair, replica_env: EnvMaker, processes: Processes
) -> None:
    env = replica_env()
    with pair.lagging():
        result = task_functions.add.enqueue(2, 3)
        burst = processes.run_jobs("--burst", env=env)
        assert burst.wait(timeout=60) == 0, burst.communicate()[0]
        shell = manage(env, "shell", "-v", "0", "-c", GET_RESULT.format(id=result.id))
        assert on_replica(pair, "SELECT COUNT(*) FROM dbqueue_job") == 0
    assert shell.returncode == 0, shell.stderr
    assert shell.stdout.splitlines()[-1].split() == ["SUCCESSFUL", "5"]


def test_check_reports_e007_for_the_router_unless_the_replica_is_marked_safe(
    replica_env: EnvMaker,
) -> None:
    unsafe = manage(replica_env(safe=False), "check")
    assert unsafe.returncode == 1
    named = [line for line in unsafe.stderr.splitlines() if "django_dbqueue.E007" in line]
    queue_models = ["Job", "WorkerProcess", "QueueState", "ScheduleTick", "Duty", "ConcurrencyKey"]
    assert sorted(line.split(":")[0] for line in named) == sorted(
        f"django_dbqueue.{model}" for model in queue_models
    )
    safe = manage(replica_env(), "check")
    assert safe.returncode == 0, safe.stderr
    assert "E007" not in safe.stdout + safe.stderr
