"""A claim that finds its candidates taken by another claimer is contention, not an empty
queue: it reads again past them, and says so when everything it saw was taken."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from django_dbqueue import enqueue_many
from django_dbqueue.models import Job
from django_dbqueue.queue import claim, clock
from tests.support import jobs

pytestmark = pytest.mark.django_db(transaction=True)
locking = pytest.mark.only_vendor("mysql", "postgresql")
# More queues than a claim walks the claim index of (claim.MOST_QUEUES_WALKED): their
# claims read candidates first on every database.
MANY_QUEUES = ["default", *(f"q{n}" for n in range(claim.MOST_QUEUES_WALKED))]


@contextmanager
def locked_by_another_claimer(ids: list[int]) -> Iterator[None]:
    """Hold row locks on ``ids`` from another connection, as a claimer mid-claim does."""
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                list(Job.objects.select_for_update().filter(pk__in=ids))
                locked.set()
                release.wait(30)
        finally:
            connection.close()

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert locked.wait(30)
        yield
    finally:
        release.set()
        thread.join(30)


@locking
def test_a_claim_whose_every_candidate_is_taken_three_times_reports_contention() -> None:
    # Each read takes SPREAD (4) batches of at least BATCH_SIZE as candidates: 3 x 4 x 100.
    ids = [job.pk for job in enqueue_many({"task": jobs.noop} for _ in range(1200))]
    with locked_by_another_claimer(ids):
        claimed = Job.objects.claim("late", batch_size=100, queues=MANY_QUEUES)
        assert claimed == []
        assert claimed.contended
    claimed = Job.objects.claim("late", batch_size=100, queues=MANY_QUEUES)
    assert [job.pk for job in claimed] == ids[:100]
    assert not claimed.contended


@locking
def test_a_claim_reads_past_the_jobs_another_claimer_holds() -> None:
    ids = [job.pk for job in enqueue_many({"task": jobs.noop} for _ in range(10))]
    with locked_by_another_claimer(ids[:5]):
        claimed = Job.objects.claim("late", batch_size=5, queues=MANY_QUEUES)
    assert [job.pk for job in claimed] == ids[5:]


@locking
def test_a_claim_whose_candidates_are_held_takes_the_spare_ones_without_reading_again() -> None:
    """Two claimers read the same candidates when one reads while the other's claim is
    under way: the later one locks the next batch of what it read, in the same
    transaction. (Many queues: on PostgreSQL a few are claimed along the index.)"""
    ids = [job.pk for job in enqueue_many({"task": jobs.noop} for _ in range(12))]
    with locked_by_another_claimer(ids[:5]), CaptureQueriesContext(connection) as queries:
        claimed = Job.objects.claim("late", batch_size=5, queues=MANY_QUEUES)
    assert [job.pk for job in claimed] == ids[5:10]
    reads = [query["sql"] for query in queries if "dbqueue_job" in query["sql"]]
    # One read of candidates; a locking read of the first five (all held), then of the
    # spare five.
    assert len([sql for sql in reads if "LIMIT" in sql and "FOR UPDATE" not in sql]) == 1
    assert len([sql for sql in reads if "FOR UPDATE SKIP LOCKED" in sql]) == 2


@locking
def test_jobs_held_by_another_claimer_and_nothing_else_is_an_empty_queue_for_us() -> None:
    ids = [job.pk for job in enqueue_many({"task": jobs.noop} for _ in range(3))]
    with locked_by_another_claimer(ids):
        claimed = Job.objects.claim("late", batch_size=10)
    assert claimed == []
    assert not claimed.contended


def test_an_empty_queue_is_not_contention() -> None:
    claimed = Job.objects.claim("a", batch_size=10)
    assert claimed == []
    assert not claimed.contended


@locking
def test_a_claim_of_one_queue_reads_past_held_jobs() -> None:
    ids = [job.pk for job in enqueue_many({"task": jobs.noop} for _ in range(10))]
    with locked_by_another_claimer(ids[:5]):
        claimed = Job.objects.claim("late", batch_size=5, queues=["default"])
    assert [job.pk for job in claimed] == ids[5:]


@pytest.fixture
def far_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server 10 ms away, as the clock's readings would measure it: MariaDB/MySQL
    then walks the claim index too (claim.walks_index)."""
    monkeypatch.setattr(clock, "round_trip", lambda using: 0.010)


@locking
@pytest.mark.usefixtures("far_server")
def test_a_claim_of_one_queue_takes_the_best_jobs_nobody_holds() -> None:
    """One locking read along the claim index: held jobs anywhere in it are skipped and
    the claim still fills its batch (candidates read first would come back short)."""
    ids = [job.pk for job in enqueue_many({"task": jobs.noop} for _ in range(10))]
    with locked_by_another_claimer(ids[:3] + ids[5:7]):
        claimed = Job.objects.claim("late", batch_size=4, queues=["default"])
    assert [job.pk for job in claimed] == [ids[3], ids[4], ids[7], ids[8]]


@locking
@pytest.mark.parametrize("away", [0.0, 0.010], ids=["near", "far"])
def test_a_claim_of_one_queue_whose_jobs_are_all_held(
    monkeypatch: pytest.MonkeyPatch, away: float
) -> None:
    monkeypatch.setattr(clock, "round_trip", lambda using: away)
    walks = claim.walks_index("default", ["default"])
    # PostgreSQL walks the index wherever its server is; MariaDB/MySQL from 2 ms away.
    assert walks == (connection.vendor == "postgresql" or away >= 0.002)
    ids = [job.pk for job in enqueue_many({"task": jobs.noop} for _ in range(60))]
    with locked_by_another_claimer(ids):
        claimed = Job.objects.claim("late", batch_size=5, queues=["default"])
    assert claimed == []
    # The walk along the index saw every runnable job held: nothing is left for this
    # claimer; and so did the candidates read first, 60 within the window of one read.
    assert not claimed.contended


@locking
@pytest.mark.usefixtures("far_server")
def test_a_claim_of_a_few_queues_takes_the_best_jobs_of_them_all_that_nobody_holds() -> None:
    """A few queues walk each one's claim index, in one transaction (PostgreSQL: in one
    locking read): held jobs are skipped, the batch fills, best first across the queues,
    and the jobs a queue's read locked beyond the batch are left queued for others."""
    assert claim.walks_index("default", ["default", "emails", "reports"])
    made = enqueue_many(
        {"task": jobs.noop, "queue": queue, "priority": priority}
        for priority in (0, 5)
        for queue in ("default", "emails", "reports")
        for _ in range(3)
    )
    held = [job.pk for job in made if job.priority == 5 and job.queue == "emails"]
    with locked_by_another_claimer(held), CaptureQueriesContext(connection) as queries:
        claimed = Job.objects.claim("late", batch_size=8, queues=["default", "emails", "reports"])
    urgent = [job.pk for job in made if job.priority == 5 and job.pk not in held]
    assert [job.pk for job in claimed][:6] == urgent  # priority 5 first, in order
    assert all(job.priority == 0 for job in claimed[6:]) and len(claimed) == 8
    left = Job.objects.filter(status=Job.Status.QUEUED).exclude(pk__in=held)
    assert left.count() == len(made) - len(held) - 8  # locked, not claimed: still queued
    walks = [query["sql"] for query in queries if "FOR UPDATE SKIP LOCKED" in query["sql"]]
    assert len(walks) == (1 if connection.vendor == "postgresql" else 3)
    assert not [query for query in queries if "UNION ALL" in query["sql"]]


def test_the_clock_measures_the_servers_round_trip() -> None:
    """What walks_index compares: the least round trip of the clock's last readings (a
    first one is read twice: it may carry the connection's warm-up). SQLite: none."""
    clock.forget()
    first = clock.round_trip("default")
    if connection.vendor == "sqlite":
        assert first == 0.0
        return
    assert 0.0 < first < 1.0
    for _ in range(3):
        clock.read("default")
    assert 0.0 < clock.round_trip("default") <= first
