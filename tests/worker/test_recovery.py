"""Lease recovery (a whole host gone): only the job a dead worker was running is charged."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from django_dbqueue import enqueue_many
from django_dbqueue.models import Job
from django_dbqueue.models import WorkerProcess as WorkerRow
from tests.support import jobs

pytestmark = pytest.mark.django_db(transaction=True)


def claim_and_expire(owner: str, count: int) -> list[Job]:
    enqueue_many({"task": jobs.noop} for _ in range(count))
    claimed = Job.objects.claim(owner, count)
    assert len(claimed) == count
    old = timezone.now() - timedelta(minutes=5)
    Job.objects.filter(pk__in=[job.pk for job in claimed]).update(owner_date=old)
    return claimed


def test_only_the_job_the_dead_workers_row_names_is_charged() -> None:
    owner = "gone:101:aaaaaa"
    running, *waiting = claim_and_expire(owner, 3)
    WorkerRow.objects.create(
        name=owner, host="gone", pid=101, role=WorkerRow.Role.CHILD, running_job_id=running.pk
    )
    assert Job.objects.recover_expired(lease_timeout=60) == (3, 0)
    running.refresh_from_db()
    assert (running.status, running.attempts) == (Job.Status.QUEUED, 1)
    assert "while running this job (attempt 1 of 3 counted)" in running.last_error
    for job in waiting:
        job.refresh_from_db()
        assert (job.status, job.attempts) == (Job.Status.QUEUED, 0)
        assert job.owner_date is None
        assert "before it started this job (attempt not counted)" in job.last_error


def test_a_worker_row_showing_no_job_charges_none() -> None:
    owner = "gone:102:bbbbbb"
    claimed = claim_and_expire(owner, 2)
    WorkerRow.objects.create(name=owner, host="gone", pid=102, role=WorkerRow.Role.CHILD)
    Job.objects.recover_expired(lease_timeout=60)
    assert [Job.objects.get(pk=job.pk).attempts for job in claimed] == [0, 0]


def test_without_a_row_to_tell_the_attempt_stays_counted() -> None:
    claimed = claim_and_expire("unknown:103:cccccc", 2)
    Job.objects.filter(pk=claimed[0].pk).update(max_attempts=1)
    assert Job.objects.recover_expired(lease_timeout=60) == (1, 1)
    first, second = (Job.objects.get(pk=job.pk) for job in claimed)
    assert (first.status, first.attempts) == (Job.Status.FAILED, 1)
    assert (second.status, second.attempts) == (Job.Status.QUEUED, 1)
    assert "stopped renewing its lease (attempt 1 of 3 counted)" in second.last_error


def test_a_job_that_was_not_running_is_never_failed_by_recovery() -> None:
    owner = "gone:104:dddddd"
    (job,) = claim_and_expire(owner, 1)
    Job.objects.filter(pk=job.pk).update(max_attempts=1)
    WorkerRow.objects.create(name=owner, host="gone", pid=104, running_job_id=job.pk + 1000)
    Job.objects.recover_expired(lease_timeout=60)
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Job.Status.QUEUED, 0)


def test_live_leases_are_left_alone() -> None:
    enqueue_many({"task": jobs.noop} for _ in range(2))
    Job.objects.claim("alive:105:eeeeee", 2)
    assert Job.objects.recover_expired(lease_timeout=60) == (0, 0)
    assert Job.objects.filter(status=Job.Status.CLAIMED).count() == 2
