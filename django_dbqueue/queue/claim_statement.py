"""A claim of one queue as one statement (PostgreSQL): lock the next rows along the claim
index, mark them claimed and read them back, in one round trip where the locking read,
the UPDATE and the COMMIT took three (docs/benchmarks.md, "2026-11-26 (fourth session)").

It takes the jobs without a concurrency key. One with a key must be admitted first
(queue/concurrency.py parks it when its key is full), so where such a job is among the
rows it locked it leaves that row alone, and says so: :func:`claim_unkeyed` tells how
many rows it locked, and the caller claims the keyed ones the usual way
(queue/claim.py, ``_claim_along_index``). Where every row it locked had a key, the next
claims of that queue skip it for a while (:func:`worth_trying`).
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from django.db import connections

from django_dbqueue.queue.candidates import queue_head, run_after_param
from django_dbqueue.queue.reader import fetch_rows, job_from_row, row_reader
from django_dbqueue.status import CLAIMED, QUEUED

if TYPE_CHECKING:
    from django_dbqueue.models import Job


# Claims of a queue to make the usual way after the statement took none of the rows it
# locked (all had a concurrency key): there it only adds a round trip. Per process,
# (alias, queue) -> claims left.
KEYED_SKIP = 8
_keyed: dict[tuple[str, str], int] = {}


def worth_trying(using: str, queue: str) -> bool:
    """Whether a claim of ``queue`` should try the statement: not for the next
    :data:`KEYED_SKIP` claims after one whose rows all had a key."""
    left = _keyed.get((using, queue))
    if not left:
        return True
    _keyed[(using, queue)] = left - 1
    return False


def forget() -> None:
    """Try the statement again at every queue's next claim (the tests)."""
    _keyed.clear()


def claim_unkeyed(
    model: type[Job], using: str, owner: str, limit: int, queue: str, now: datetime
) -> tuple[list[Job], int]:
    """Claim the first ``limit`` runnable jobs of ``queue`` that no other claimer holds,
    unless they have a concurrency key: (the jobs claimed, best first; the rows locked).
    Attempts are counted as the usual claim counts them."""
    conn = connections[using]
    qn = conn.ops.quote_name
    table = qn(model._meta.db_table)
    reader = row_reader(model, conn)
    when = run_after_param(model, conn, now)
    owner_date = conn.ops.adapt_datetimefield_value(now)
    sql = (
        f"WITH picked AS (SELECT {qn('id')} AS picked_id FROM {table} "  # noqa: S608
        f"WHERE {queue_head(conn)} FOR UPDATE SKIP LOCKED), "
        f"taken AS (UPDATE {table} SET {qn('status')} = %s, {qn('owner')} = %s, "
        f"{qn('owner_date')} = %s, {qn('attempts')} = {qn('attempts')} + 1 FROM picked "
        f"WHERE {table}.{qn('id')} = picked.picked_id "
        f"AND {table}.{qn('concurrency_key')} IS NULL RETURNING {reader.columns}) "
        # One row at least, to tell how many were locked when none was taken.
        f"SELECT taken.*, counted.n FROM (SELECT count(*) AS n FROM picked) AS counted "
        "LEFT JOIN taken ON TRUE"
    )
    params = [QUEUED, queue, when, limit, CLAIMED, owner, owner_date]
    rows = fetch_rows(conn, sql, params)
    locked = int(rows[0][-1])
    first = reader.names.index("id")
    jobs = [job_from_row(model, using, row[:-1], reader, conn) for row in rows if row[first]]
    for job in jobs:
        job.owner, job.owner_date = owner, now
    jobs.sort(key=claim_order)
    if locked and not jobs:
        _keyed[(using, queue)] = KEYED_SKIP
    return jobs, locked


def claim_order(job: Job) -> tuple[int, datetime, int]:
    """The claim index's order, best first: priority descending, then run_after, id."""
    return -job.priority, job.run_after, job.id
