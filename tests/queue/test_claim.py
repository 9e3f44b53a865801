from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_dbqueue import enqueue, enqueue_many
from django_dbqueue.models import Job
from tests.support import jobs


@pytest.mark.django_db
def test_claim_orders_by_priority_then_run_after_then_id() -> None:
    now = timezone.now()
    low = enqueue(jobs.noop, priority=-1)
    old = enqueue(jobs.noop, run_after=now - timedelta(minutes=1))
    first = enqueue(jobs.noop)
    second = enqueue(jobs.noop)
    urgent = enqueue(jobs.noop, priority=10)
    claimed = Job.objects.claim("w1", batch_size=10)
    assert [j.pk for j in claimed] == [urgent.pk, old.pk, first.pk, second.pk, low.pk]


@pytest.mark.django_db
def test_claim_marks_owner_and_counts_the_attempt() -> None:
    job = enqueue(jobs.noop)
    [claimed] = Job.objects.claim("host:1:abc", batch_size=5)
    stored = Job.objects.get(pk=job.pk)
    assert claimed.pk == job.pk
    assert stored.status == Job.Status.CLAIMED
    assert stored.owner == "host:1:abc"
    assert stored.owner_date is not None
    assert stored.attempts == 1 == claimed.attempts
    assert Job.objects.claim("other", batch_size=5) == []


@pytest.mark.django_db
def test_claim_respects_batch_size_queues_and_run_after() -> None:
    enqueue_many([{"task": jobs.noop} for _ in range(7)])
    enqueue(jobs.noop, queue="emails")
    enqueue(jobs.noop, run_after=timedelta(hours=1))
    assert len(Job.objects.claim("a", batch_size=5, queues=["default"])) == 5
    assert len(Job.objects.claim("a", batch_size=5, queues=["default"])) == 2
    [email] = Job.objects.claim("a", batch_size=5, queues=["emails", "reports"])
    assert email.queue == "emails"
    assert Job.objects.claim("a", batch_size=5) == []
    assert Job.objects.filter(status=Job.Status.QUEUED).count() == 1


@pytest.mark.django_db
def test_claim_rejects_a_zero_batch() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        Job.objects.claim("a", batch_size=0)


@pytest.mark.django_db(transaction=True)
def test_job_enqueued_in_open_transaction_is_invisible_until_commit() -> None:
    """A worker (another connection) never gets a job before its transaction commits.

    On SQLite the worker's IMMEDIATE claim waits for the writer instead, and must get
    the job only once it is committed.
    """
    got: list[tuple[float, list[int]]] = []

    def worker() -> None:
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                claimed = Job.objects.claim("thread-worker", batch_size=10)
                if claimed:
                    got.append((time.monotonic(), [j.pk for j in claimed]))
                    return
                got.append((time.monotonic(), []))
                time.sleep(0.02)
        finally:
            connection.close()

    with transaction.atomic():
        job = enqueue(jobs.noop)
        thread = threading.Thread(target=worker)
        thread.start()
        time.sleep(0.5)
        committed_at = time.monotonic()
    thread.join(30)
    empty_polls = [t for t, ids in got if not ids]
    [(when, ids)] = [(t, ids) for t, ids in got if ids]
    assert ids == [job.pk]
    assert when >= committed_at
    assert all(t < committed_at + 0.5 for t in empty_polls)
    if connection.vendor != "sqlite":
        assert empty_polls, "the worker should have polled while the transaction was open"


@pytest.mark.django_db
def test_finishing_clears_a_cancel_request_that_came_too_late() -> None:
    job = enqueue(jobs.noop)
    [claimed] = Job.objects.claim("w1", batch_size=1)
    Job.objects.filter(pk=job.pk).update(cancel_requested=True)
    assert Job.objects.finish_done("w1", [claimed]) == {job.pk}
    stored = Job.objects.get(pk=job.pk)
    assert (stored.status, stored.cancel_requested) == (Job.Status.DONE, False)


@pytest.mark.django_db
def test_finishing_a_batch_writes_each_jobs_own_start_and_result() -> None:
    """One statement for the batch (a JSON parameter on MariaDB, arrays on PostgreSQL, a
    CASE on SQLite) still writes each job's own values: the first attempt's start only
    while started_at is NULL, a later attempt's to last_attempted_at, each job's result;
    and nothing to a job another worker took over."""
    first, later, shown, taken = (enqueue(jobs.noop).pk for _ in range(4))
    claimed = {job.pk: job for job in Job.objects.claim("w1", batch_size=4, queues=["default"])}
    base = timezone.now() - timedelta(minutes=5)
    earlier = base - timedelta(hours=1)
    claimed[later].started_at = earlier  # read so by the claim: an earlier attempt ran
    Job.objects.filter(pk__in=[later, shown]).update(
        started_at=earlier
    )  # shown: the supervisor wrote it
    Job.objects.filter(pk=taken).update(owner="w2")
    for offset, job in enumerate(claimed[pk] for pk in (first, later, shown, taken)):
        job.note_attempt(base + timedelta(seconds=offset))
        job.finished_at = base + timedelta(seconds=offset, microseconds=offset + 1)
        job.result = {"n": offset}

    assert Job.objects.finish_done("w1", list(claimed.values())) == {first, later, shown}

    stored = Job.objects.in_bulk([first, later, shown, taken])
    assert stored[first].started_at == base
    assert stored[first].last_attempted_at is None
    assert stored[later].started_at == earlier
    assert stored[later].last_attempted_at == base + timedelta(seconds=1)
    assert stored[shown].started_at == earlier
    # Each job's own end, to the microsecond (MariaDB: sent as microseconds since the epoch).
    ends = [base + timedelta(seconds=n, microseconds=n + 1) for n in range(3)]
    assert [stored[pk].finished_at for pk in (first, later, shown)] == ends
    assert [stored[pk].result for pk in (first, later, shown)] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert all(stored[pk].status == Job.Status.DONE for pk in (first, later, shown))
    assert (stored[taken].status, stored[taken].started_at, stored[taken].result) == (
        Job.Status.CLAIMED,
        None,
        None,
    )


@pytest.mark.django_db
@pytest.mark.parametrize("use_tz", [True, False], ids=["aware", "naive"])
def test_finishing_writes_each_jobs_own_times_to_the_microsecond(
    settings: Any, use_tz: bool
) -> None:
    """The times a run noted are the times stored, aware (sent as microseconds since the
    epoch on MariaDB and PostgreSQL) or naive (``USE_TZ = False``: as Django sends them)."""
    settings.USE_TZ = use_tz
    ids = [enqueue(jobs.noop).pk for _ in range(3)]
    claimed = Job.objects.claim("w1", batch_size=3, queues=["default"])
    start = datetime(2026, 11, 26, 23, 59, 58, 999_999)
    if use_tz:
        start = start.replace(tzinfo=UTC)
    for n, job in enumerate(claimed):
        job.note_attempt(start + timedelta(microseconds=n))
        job.finished_at = start + timedelta(seconds=1, microseconds=n)
    assert Job.objects.finish_done("w1", list(claimed)) == set(ids)
    stored = sorted(Job.objects.filter(pk__in=ids), key=lambda job: job.started_at)
    assert [job.started_at for job in stored] == [
        start + timedelta(microseconds=n) for n in range(3)
    ]
    assert [job.finished_at for job in stored] == [
        start + timedelta(seconds=1, microseconds=n) for n in range(3)
    ]


@pytest.mark.django_db
@pytest.mark.parametrize("use_tz", [True, False], ids=["aware", "naive"])
def test_a_claimed_job_reads_as_the_orm_reads_it(settings: Any, use_tz: bool) -> None:
    """The claim's own row reader (queue/reader.py, with cheaper converters on MySQL)
    gives every column it reads the value and type the ORM gives it."""
    settings.USE_TZ = use_tz
    job = enqueue(jobs.noop, args=[1, "two"], kwargs={"k": [3]}, priority=5)
    [claimed] = Job.objects.claim("w1", batch_size=1, queues=["default"])
    stored = Job.objects.get(pk=job.pk)
    read = {name: value for name, value in claimed.__dict__.items() if not name.startswith("_")}
    assert read  # the reader's columns
    for name, value in read.items():
        expected = getattr(stored, name)
        assert (value, type(value)) == (expected, type(expected)), name
        # Aware in the same time zone (PostgreSQL's claim reads timestamptz with
        # psycopg's own loader, not Django's: dialects/postgresql.py).
        assert getattr(value, "tzinfo", None) == getattr(expected, "tzinfo", None), name
