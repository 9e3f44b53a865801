"""PostgreSQL claims one queue in one statement (queue/claim_statement.py): lock, mark and
read back, where it took a locking read, an UPDATE and a COMMIT. Jobs with a concurrency
key among the rows it locks are left to the usual claim, which admits or parks them."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_dbqueue import enqueue, enqueue_many
from django_dbqueue.models import ConcurrencyKey, Job
from django_dbqueue.queue import claim_statement
from django_dbqueue.queue.concurrency import PARKED_UNTIL
from django_dbqueue.queue.shares import Shares
from tests.support import jobs

pytestmark = pytest.mark.django_db(transaction=True)
S = Job.Status


@pytest.mark.only_vendor("postgresql")
def test_a_claim_of_one_queue_is_one_statement() -> None:
    enqueued = enqueue_many({"task": jobs.noop, "priority": n % 3} for n in range(6))
    table = Job._meta.db_table
    with CaptureQueriesContext(connection) as seen:
        claimed = Job.objects.claim("w1", batch_size=10, queues=["default"])
    statements = [q["sql"] for q in seen.captured_queries if table in q["sql"]]
    assert len(statements) == 1, statements
    assert "FOR UPDATE SKIP LOCKED" in statements[0] and "RETURNING" in statements[0]
    assert not [q for q in seen.captured_queries if q["sql"] in ("BEGIN", "COMMIT")]
    best_first = sorted(enqueued, key=lambda job: (-job.priority, job.run_after, job.id))
    assert [job.id for job in claimed] == [job.id for job in best_first]
    stored = {job.id: job for job in Job.objects.all()}
    for job in claimed:
        row = stored[job.id]
        assert (row.status, row.owner, row.attempts) == (S.CLAIMED, "w1", 1)
        assert (job.status, job.owner, job.attempts) == (S.CLAIMED, "w1", 1)
        assert job.owner_date == row.owner_date


@pytest.mark.only_vendor("mysql", "postgresql")
def test_keyed_jobs_among_the_locked_rows_are_admitted_or_parked() -> None:
    first = enqueue(jobs.noop, priority=5)
    keyed = [enqueue(jobs.noop, concurrency_key="k", priority=4) for _ in range(2)]
    last = enqueue(jobs.noop)
    claimed = Job.objects.claim("w1", batch_size=10, queues=["default"])
    assert [job.id for job in claimed] == [first.id, keyed[0].id, last.id]
    parked = Job.objects.get(pk=keyed[1].pk)
    assert (parked.status, parked.attempts, parked.run_after) == (S.QUEUED, 0, PARKED_UNTIL)
    assert ConcurrencyKey.objects.get(key="k").parked
    assert Job.objects.filter(status=S.CLAIMED, owner="w1").count() == 3


@pytest.mark.only_vendor("mysql", "postgresql")
def test_only_keyed_jobs_are_claimed_as_before() -> None:
    keyed = [enqueue(jobs.noop, concurrency_key="k", concurrency_limit=2) for _ in range(3)]
    claimed = Job.objects.claim("w1", batch_size=10, queues=["default"])
    assert [job.id for job in claimed] == [keyed[0].id, keyed[1].id]
    assert Job.objects.claim("w2", batch_size=10, queues=["default"]) == []


@pytest.mark.only_vendor("mysql", "postgresql")
def test_a_claim_takes_no_more_than_its_batch_with_keys_among_the_rows() -> None:
    enqueue(jobs.noop, concurrency_key="k", priority=1)
    plain = [enqueue(jobs.noop) for _ in range(4)]
    claimed = Job.objects.claim("w1", batch_size=3, queues=["default"])
    assert len(claimed) == 3
    assert [job.id for job in claimed[1:]] == [plain[0].id, plain[1].id]


@pytest.mark.only_vendor("postgresql")
def test_after_a_claim_of_only_keyed_rows_the_next_claims_skip_the_statement() -> None:
    keyed = [enqueue(jobs.noop, concurrency_key=f"k{n}") for n in range(2)]

    def claim_and_count() -> tuple[list[int], int]:
        with CaptureQueriesContext(connection) as seen:
            got = Job.objects.claim("w1", batch_size=1, queues=["default"])
        return [job.id for job in got], sum("RETURNING" in q["sql"] for q in seen.captured_queries)

    assert claim_and_count() == ([keyed[0].id], 1), "tried, then claimed the usual way"
    assert claim_and_count() == ([keyed[1].id], 0), "skipped"
    for _ in range(claim_statement.KEYED_SKIP - 1):
        assert claim_and_count() == ([], 0)
    plain = enqueue(jobs.noop)
    assert claim_and_count() == ([plain.id], 1), "tried again"


@pytest.mark.only_vendor("postgresql")
def test_a_hosts_claim_of_a_few_queues_for_its_children_is_one_statement() -> None:
    """A host's claimer (worker/handout.py) claims several queues for several children:
    one statement still, the best jobs across the queues first, each job its asker's in
    claim order; a keyed job among them is claimed the usual way, for the next asker."""
    queues = ["default", "emails", "reports"]
    made = enqueue_many(
        {"task": jobs.noop, "queue": queue, "priority": n % 4} for n, queue in enumerate(queues * 4)
    )
    keyed = enqueue(jobs.noop, queue="emails", concurrency_key="k", priority=9)
    table = Job._meta.db_table
    shares = Shares([("c1", 4), ("c2", 4), ("c3", 6)])
    with CaptureQueriesContext(connection) as seen:
        claimed = Job.objects.claim(shares, shares.total, queues)
    best_first = sorted([*made, keyed], key=lambda job: (-job.priority, job.run_after, job.id))
    assert [job.id for job in claimed] == [job.id for job in best_first][:13]
    # The statement's jobs go to the askers in order; the keyed one, claimed after them
    # (the best of all: priority 9), to the asker whose share is left.
    assert claimed[0].id == keyed.id and claimed[0].owner == "c3"
    assert [job.owner for job in claimed[1:]] == ["c1"] * 4 + ["c2"] * 4 + ["c3"] * 4
    stored = dict(Job.objects.filter(status=S.CLAIMED).values_list("pk", "owner"))
    assert stored == {job.id: job.owner for job in claimed}
    returning = [q["sql"] for q in seen.captured_queries if "RETURNING" in q["sql"]]
    assert len(returning) == 1 and "LATERAL" in returning[0]
    # The keyed job was locked by the statement and left to the usual claim, which
    # admitted it under its key.
    assert Job.objects.get(pk=keyed.pk).owner == "c3"
    assert table in returning[0]
