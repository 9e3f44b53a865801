"""A claim as one statement (PostgreSQL): lock the next rows along the claim index of
each queue, mark them claimed and read them back, in one round trip where the locking
read, the UPDATE and the COMMIT took three (docs/benchmarks.md, "2026-11-26 (fourth
session)"). One worker's claim, or a host's for its children (queue/shares.py: each row
numbered in claim order gets the owner of that place); one queue, or a few (a LATERAL
read of each queue's head, queue/candidates.py).

It takes the jobs without a concurrency key. One with a key must be admitted first
(queue/concurrency.py parks it when its key is full), so where such a job is among the
rows it locked it leaves that row alone, and says so: :func:`claim_unkeyed` tells how
many rows it locked, and the caller claims the keyed ones the usual way
(queue/claim.py, ``_claim_along_index``). Where every row it locked had a key, the next
claims of those queues skip it for a while (:func:`worth_trying`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from django_dbqueue.queue.candidates import queue_head, queue_heads, run_after_param
from django_dbqueue.queue.reader import fetch_rows, job_from_row, row_reader
from django_dbqueue.queue.shares import Owner
from django_dbqueue.status import CLAIMED, QUEUED

if TYPE_CHECKING:
    from django_dbqueue.models import Job


# Claims of some queues to make the usual way after the statement took none of the rows
# it locked (all had a concurrency key): there it only adds a round trip. Per process,
# (alias, queues) -> claims left.
KEYED_SKIP = 8
_keyed: dict[tuple[str, tuple[str, ...]], int] = {}


def worth_trying(using: str, queues: Sequence[str]) -> bool:
    """Whether a claim of ``queues`` should try the statement: not for the next
    :data:`KEYED_SKIP` claims after one whose rows all had a key."""
    key = (using, tuple(queues))
    left = _keyed.get(key)
    if not left:
        return True
    _keyed[key] = left - 1
    return False


def forget() -> None:
    """Try the statement again at every queue's next claim (the tests)."""
    _keyed.clear()


def claim_unkeyed(
    model: type[Job], using: str, owner: Owner, limit: int, queues: list[str], now: datetime
) -> tuple[list[Job], int]:
    """Claim the first ``limit`` runnable jobs of ``queues`` that no other claimer holds,
    unless they have a concurrency key: (the jobs claimed, best first; the rows locked).
    Attempts are counted as the usual claim counts them."""
    conn = connections[using]
    qn = conn.ops.quote_name
    table = qn(model._meta.db_table)
    reader = row_reader(model, conn)
    picked, picked_params = _picked(model, conn, queues, limit, now)
    owner_param: str | list[str]
    if isinstance(owner, str):
        owner_sql, owner_param = "%s", owner
    else:  # the n-th row in claim order: the n-th of the shares
        owner_sql, owner_param = "(%s::varchar[])[numbered.n]", owner.upcoming(limit)
    order = "priority DESC, run_after, picked_id"
    sql = (
        f"WITH picked AS ({picked}), "  # noqa: S608
        f"numbered AS (SELECT picked_id, row_number() OVER (ORDER BY {order}) AS n "
        f"FROM picked WHERE concurrency_key IS NULL), "
        f"taken AS (UPDATE {table} SET {qn('status')} = %s, {qn('owner')} = {owner_sql}, "
        f"{qn('owner_date')} = %s, {qn('attempts')} = {qn('attempts')} + 1 FROM numbered "
        f"WHERE {table}.{qn('id')} = numbered.picked_id RETURNING {reader.columns}) "
        # One row at least, to tell how many were locked when none was taken.
        f"SELECT taken.*, counted.n FROM (SELECT count(*) AS n FROM picked) AS counted "
        "LEFT JOIN taken ON TRUE"
    )
    owner_date = conn.ops.adapt_datetimefield_value(now)
    rows = fetch_rows(conn, sql, [*picked_params, CLAIMED, owner_param, owner_date])
    locked = int(rows[0][-1])
    first = reader.names.index("id")
    jobs = [job_from_row(model, using, row[:-1], reader, conn) for row in rows if row[first]]
    jobs.sort(key=claim_order)
    owners = [owner] * len(jobs) if isinstance(owner, str) else owner.take(len(jobs))
    for job, name in zip(jobs, owners, strict=True):
        job.owner, job.owner_date = name, now
    if locked and not jobs:
        _keyed[(using, tuple(queues))] = KEYED_SKIP
    return jobs, locked


def _picked(
    model: type[Job], conn: BaseDatabaseWrapper, queues: list[str], limit: int, now: datetime
) -> tuple[str, list[Any]]:
    """The locking read of the statement: (picked_id, priority, run_after,
    concurrency_key) of the first ``limit`` runnable jobs of ``queues``, and its
    parameters."""
    qn = conn.ops.quote_name
    table = qn(model._meta.db_table)
    when = run_after_param(model, conn, now)
    keys = ("id", "priority", "run_after", "concurrency_key")
    named = ", ".join(f"{qn(key)} AS {'picked_id' if key == 'id' else key}" for key in keys)
    if len(queues) == 1:
        head = queue_head(conn)
        sql = f"SELECT {named} FROM {table} WHERE {head} FOR UPDATE SKIP LOCKED"  # noqa: S608
        return sql, [QUEUED, queues[0], when, limit]
    heads = queue_heads(conn, ", ".join(qn(key) for key in keys), table)
    sql = f"SELECT {named} FROM ({heads}) AS heads"  # noqa: S608
    return sql, [queues, QUEUED, when, limit, limit]


def claim_order(job: Job) -> tuple[int, datetime, int]:
    """The claim index's order, best first: priority descending, then run_after, id."""
    return -job.priority, job.run_after, job.id
