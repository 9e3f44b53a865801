"""Lease recovery (a whole host gone): jobs that provably had not started are not charged."""

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


def test_jobs_after_the_one_the_row_names_get_their_attempt_back() -> None:
    owner = "gone:101:aaaaaa"
    done_unrecorded, running, *waiting = claim_and_expire(owner, 4)
    WorkerRow.objects.create(
        name=owner, host="gone", pid=101, role=WorkerRow.Role.CHILD, running_job_id=running.pk
    )
    assert Job.objects.recover_expired(lease_timeout=60) == (4, 0)
    running.refresh_from_db()
    assert (running.status, running.attempts) == (Job.Status.QUEUED, 1)
    assert "while running this job (attempt 1 of 3 counted)" in running.last_error
    # It ran before the running one (its DONE write may have been pending): counted.
    done_unrecorded.refresh_from_db()
    assert (done_unrecorded.status, done_unrecorded.attempts) == (Job.Status.QUEUED, 1)
    assert "stopped renewing its lease (attempt 1 of 3 counted)" in done_unrecorded.last_error
    for job in waiting:
        job.refresh_from_db()
        assert (job.status, job.attempts) == (Job.Status.QUEUED, 0)
        assert job.owner_date is None
        assert "before it started this job (attempt not counted)" in job.last_error


def test_claim_order_decides_what_came_after_the_running_job() -> None:
    owner = "gone:102:bbbbbb"
    enqueue_many({"task": jobs.noop, "priority": p} for p in (0, 5, 0))
    low_first, high, low_last = Job.objects.order_by("id")
    claimed = Job.objects.claim(owner, 3)
    assert [job.pk for job in claimed] == [high.pk, low_first.pk, low_last.pk]
    Job.objects.update(owner_date=timezone.now() - timedelta(minutes=5))
    WorkerRow.objects.create(name=owner, host="gone", pid=102, running_job_id=low_first.pk)
    Job.objects.recover_expired(lease_timeout=60)
    attempts = dict(Job.objects.values_list("pk", "attempts"))
    assert attempts == {high.pk: 1, low_first.pk: 1, low_last.pk: 0}


@pytest.mark.parametrize("shown", [None, 10**9], ids=["no job", "a job no longer claimed"])
def test_a_row_naming_no_claimed_job_tells_nothing_so_all_are_charged(shown: int | None) -> None:
    owner = "gone:103:cccccc"
    claimed = claim_and_expire(owner, 2)
    WorkerRow.objects.create(name=owner, host="gone", pid=103, running_job_id=shown)
    Job.objects.recover_expired(lease_timeout=60)
    assert [Job.objects.get(pk=job.pk).attempts for job in claimed] == [1, 1]


def test_without_a_row_to_tell_the_attempt_stays_counted() -> None:
    claimed = claim_and_expire("unknown:104:dddddd", 2)
    Job.objects.filter(pk=claimed[0].pk).update(max_attempts=1)
    assert Job.objects.recover_expired(lease_timeout=60) == (1, 1)
    first, second = (Job.objects.get(pk=job.pk) for job in claimed)
    assert (first.status, first.attempts) == (Job.Status.FAILED, 1)
    assert (second.status, second.attempts) == (Job.Status.QUEUED, 1)
    assert "stopped renewing its lease (attempt 1 of 3 counted)" in second.last_error


def test_a_job_that_had_not_started_is_never_failed_by_recovery() -> None:
    owner = "gone:105:eeeeee"
    running, waiting = claim_and_expire(owner, 2)
    Job.objects.filter(pk=waiting.pk).update(max_attempts=1)
    WorkerRow.objects.create(name=owner, host="gone", pid=105, running_job_id=running.pk)
    Job.objects.recover_expired(lease_timeout=60)
    waiting.refresh_from_db()
    assert (waiting.status, waiting.attempts) == (Job.Status.QUEUED, 0)


def test_live_leases_are_left_alone() -> None:
    enqueue_many({"task": jobs.noop} for _ in range(2))
    Job.objects.claim("alive:105:eeeeee", 2)
    assert Job.objects.recover_expired(lease_timeout=60) == (0, 0)
    assert Job.objects.filter(status=Job.Status.CLAIMED).count() == 2
