"""The operator operations on JobQuerySet that the admin calls."""

from __future__ import annotations

import signal
from collections.abc import Callable
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_dbqueue import enqueue
from django_dbqueue.models import Job
from django_dbqueue.registry import task_path
from django_dbqueue.worker.loop import Worker
from tests.support import Processes, jobs, wait_until

pytestmark = pytest.mark.django_db

S = Job.Status


def make(status: str, **fields: object) -> Job:
    return Job.objects.create(task="tests.support.jobs.add", args=[1, 2], status=status, **fields)


def test_requeue_resets_finished_jobs_and_leaves_the_others() -> None:
    later = timezone.now() + timedelta(hours=1)
    failed = make(
        S.FAILED,
        attempts=3,
        owner="w1",
        owner_date=timezone.now(),
        last_error="ValueError: boom",
        errors=[{"exception_class_path": "builtins.ValueError", "traceback": "tb", "at": "x"}],
        finished_at=timezone.now(),
        started_at=timezone.now(),
        run_after=later,
    )
    done = make(S.DONE, attempts=1, result=3, finished_at=timezone.now())
    cancelled = make(S.CANCELLED, finished_at=timezone.now())
    queued = make(S.QUEUED, attempts=1)
    claimed = make(S.CLAIMED, attempts=1, owner="w2")

    assert Job.objects.get_queryset().requeue() == 3

    failed.refresh_from_db()
    assert failed.status == S.QUEUED
    assert failed.attempts == 0
    assert (failed.owner, failed.owner_date, failed.finished_at, failed.started_at) == (
        "",
        None,
        None,
        None,
    )
    assert failed.run_after == later, "without run_now the schedule is kept"
    assert failed.last_error == "ValueError: boom", "the earlier error stays readable"
    assert len(failed.errors) == 1
    assert failed.unique_key is None
    done.refresh_from_db()
    assert (done.status, done.result) == (S.QUEUED, None)
    assert cancelled.refresh_status() == S.QUEUED
    queued.refresh_from_db()
    assert (queued.status, queued.attempts) == (S.QUEUED, 1)
    claimed.refresh_from_db()
    assert (claimed.status, claimed.owner) == (S.CLAIMED, "w2"), "a running job is untouched"


def test_requeue_run_now_makes_the_job_runnable_at_once() -> None:
    job = make(S.FAILED, run_after=timezone.now() + timedelta(days=1))
    # Job.objects.filter() returns the JobQuerySet too.
    assert Job.objects.filter(pk=job.pk).requeue(run_now=True) == 1  # type: ignore[attr-defined]
    assert list(Job.objects.runnable()) == [job]


def test_cancel_cancels_queued_and_flags_claimed_jobs() -> None:
    queued = make(S.QUEUED, unique_key="only-one")
    claimed = make(S.CLAIMED, owner="w1", owner_date=timezone.now())
    done = make(S.DONE, finished_at=timezone.now())

    assert Job.objects.get_queryset().cancel() == (1, 1)

    queued.refresh_from_db()
    assert queued.status == S.CANCELLED
    assert queued.finished_at is not None
    assert queued.unique_key is None, "the key is free for a new job"
    claimed.refresh_from_db()
    assert (claimed.status, claimed.cancel_requested) == (S.CLAIMED, True)
    assert Job.objects.get_queryset().filter(pk=claimed.pk).cancel() == (0, 1)
    done.refresh_from_db()
    assert (done.status, done.cancel_requested) == (S.DONE, False)
    # A cancelled job is never claimed.
    assert Job.objects.claim("w3", 10) == []


def test_run_now_only_moves_queued_jobs() -> None:
    future = timezone.now() + timedelta(hours=2)
    queued = make(S.QUEUED, run_after=future)
    failed = make(S.FAILED, run_after=future)
    assert Job.objects.claim("w", 10) == []
    assert Job.objects.get_queryset().run_now() == 1
    assert [job.pk for job in Job.objects.claim("w", 10)] == [queued.pk]
    failed.refresh_from_db()
    assert failed.run_after == future


def test_delete_unclaimed_keeps_running_jobs() -> None:
    for status in (S.QUEUED, S.DONE, S.FAILED, S.CANCELLED):
        make(status)
    claimed = make(S.CLAIMED, owner="w1")
    assert Job.objects.get_queryset().delete_unclaimed() == 4
    assert list(Job.objects.all()) == [claimed]


@pytest.mark.django_db(transaction=True)
def test_requeued_job_runs_again() -> None:
    # The worker closes connections between jobs: it needs committed data, not a
    # test transaction.
    job = Job.objects.create(
        task=task_path(jobs.add), args=[20, 22], status=S.FAILED, attempts=3, last_error="boom"
    )
    Job.objects.get_queryset().filter(pk=job.pk).requeue()
    stats = Worker(burst=True, handle_signals=False).run()
    assert stats.done == 1
    job.refresh_from_db()
    assert (job.status, job.result, job.attempts) == (S.DONE, 42, 1)


@pytest.mark.processes
def test_admin_cancel_stops_a_job_a_real_worker_is_running(
    admin_client: Client, processes: Processes, worker_env: Callable[..., dict[str, str]]
) -> None:
    running = enqueue(jobs.sleep, [60])
    proc = processes.run_jobs(
        "--batch-size", "1", env=worker_env(LEASE_TIMEOUT=3, HEARTBEAT_INTERVAL=0.3)
    )
    wait_until(lambda: running.refresh_status() == S.CLAIMED, timeout=30)
    response = admin_client.post(
        reverse("admin:django_dbqueue_job_changelist"),
        {"action": "cancel_jobs", "index": "0", "_selected_action": [str(running.pk)]},
        follow=True,
    )
    assert "Asked the workers running 1 job(s) to stop them" in str(
        list(response.context["messages"])[1]
    )
    wait_until(lambda: running.refresh_status() == S.CANCELLED, timeout=15)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
