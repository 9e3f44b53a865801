"""Candidate ids for a claim: the next runnable jobs of some queues, best first, read
along the claim index without locking (queue/claim.py locks them next)."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db.backends.base.base import BaseDatabaseWrapper

from django_dbqueue.queue.dialects import dialect, placeholders
from django_dbqueue.status import QUEUED

if TYPE_CHECKING:
    from django_dbqueue.models import Job

# Queues read per statement: SQLite allows 500 terms in a compound SELECT, and past a
# few hundred branches the planners spend longer on the statement than on the rows.
QUEUES_PER_STATEMENT = 100


def candidate_ids(
    model: type[Job],
    conn: BaseDatabaseWrapper,
    queues: list[str],
    now: datetime,
    limit: int,
    exclude: list[int],
) -> list[int]:
    """Ids of the next runnable jobs, best first, each queue read along the claim index.

    ``queue IN (a, b)`` would make the database sort every queued row of those
    queues; one index range per queue, each stopping after ``limit`` rows, and a
    merge of at most ``limit * len(queues)`` rows keeps the cost flat. Many queues are
    read in chunks of :data:`QUEUES_PER_STATEMENT`, merged here by the same order.
    ``exclude``: ids another claimer was seen taking, skipped in the index walk.
    """
    if len(queues) <= QUEUES_PER_STATEMENT:
        return [row[0] for row in _candidates(model, conn, queues, now, limit, exclude, False)]
    if dialect(conn).lateral_arrays:
        return _candidates_lateral(model, conn, queues, now, limit, exclude)
    rows: list[tuple[Any, ...]] = []
    for start in range(0, len(queues), QUEUES_PER_STATEMENT):
        chunk = queues[start : start + QUEUES_PER_STATEMENT]
        rows += _candidates(model, conn, chunk, now, limit, exclude, True)
    # The database's order: priority descending, then run_after, then id.
    rows.sort(key=lambda row: (-row[1], row[2], row[0]))
    return [row[0] for row in rows[:limit]]


def _candidates(
    model: type[Job],
    conn: BaseDatabaseWrapper,
    queues: list[str],
    now: datetime,
    limit: int,
    exclude: list[int],
    sort_keys: bool,
) -> list[tuple[Any, ...]]:
    """(id,) of the best ``limit`` runnable jobs of ``queues``, or with ``sort_keys``
    (id, priority, run_after), for merging with another statement's (a datetime parsed
    per row only then)."""
    qn = conn.ops.quote_name
    table = qn(model._meta.db_table)
    when = run_after_param(model, conn, now)
    order = f"{qn('priority')} DESC, {qn('run_after')}, {qn('id')}"
    skip = f"AND {qn('id')} NOT IN ({placeholders(len(exclude))}) " if exclude else ""
    keys = f"{qn('id')}, {qn('priority')}, {qn('run_after')}"
    columns = keys if sort_keys or len(queues) > 1 else qn("id")
    one = (
        f"SELECT {columns} FROM {table} "  # noqa: S608
        f"WHERE {qn('status')} = %s AND {qn('queue')} = %s AND {qn('run_after')} <= %s "
        f"{skip}ORDER BY {order} LIMIT %s"
    )
    params: list[Any] = []
    for queue in queues:
        params += [QUEUED, queue, when, *exclude, limit]
    if len(queues) == 1:
        sql = one
    else:
        parts = " UNION ALL ".join(
            f"SELECT * FROM ({one}) AS q{i}"  # noqa: S608
            for i in range(len(queues))
        )
        merged = "*" if sort_keys else qn("id")
        sql = f"SELECT {merged} FROM ({parts}) AS c ORDER BY {order} LIMIT %s"  # noqa: S608
        params.append(limit)
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        return [tuple(row) for row in cursor.fetchall()]


def _candidates_lateral(
    model: type[Job],
    conn: BaseDatabaseWrapper,
    queues: list[str],
    now: datetime,
    limit: int,
    exclude: list[int],
) -> list[int]:
    """The same index range per queue in one statement, the queues passed as one array.

    2,000 queues: one plan of a nested loop (about 10 ms), where 2,000 UNION ALL
    branches took the planner seconds.
    """
    qn = conn.ops.quote_name
    array = dialect(conn).array
    when = run_after_param(model, conn, now)
    columns = f"{qn('id')}, {qn('priority')}, {qn('run_after')}"
    order = f"c.{qn('priority')} DESC, c.{qn('run_after')}, c.{qn('id')}"
    sql = (
        f"SELECT c.{qn('id')} FROM unnest({array('varchar')}) AS q(name) "  # noqa: S608
        f"CROSS JOIN LATERAL (SELECT {columns} FROM {qn(model._meta.db_table)} "
        f"WHERE {qn('status')} = %s AND {qn('queue')} = q.name AND {qn('run_after')} <= %s "
        f"AND NOT ({qn('id')} = ANY({array('bigint')})) "
        f"ORDER BY {qn('priority')} DESC, {qn('run_after')}, {qn('id')} LIMIT %s) AS c "
        f"ORDER BY {order} LIMIT %s"
    )
    with conn.cursor() as cursor:
        cursor.execute(sql, [queues, QUEUED, when, exclude, limit, limit])
        return [row[0] for row in cursor.fetchall()]


def queue_head(conn: BaseDatabaseWrapper) -> str:
    """``WHERE`` text (without the keyword) of the first runnable jobs of one queue, best
    first, column for column the claim index: its parameters are QUEUED, the queue,
    :func:`run_after_param` and the limit. A locking read of it locks what it scans."""
    qn = conn.ops.quote_name
    return (
        f"{qn('status')} = %s AND {qn('queue')} = %s AND {qn('run_after')} <= %s "
        f"ORDER BY {qn('priority')} DESC, {qn('run_after')}, {qn('id')} LIMIT %s"
    )


def queue_heads(conn: BaseDatabaseWrapper, columns: str, table: str) -> str:
    """A locking read of the first runnable jobs of each of several queues, the best
    overall first (``lateral_arrays``: PostgreSQL): each queue's head is read along the
    claim index as :func:`queue_head`'s, in one statement. Its parameters: the queues
    (one array), QUEUED, :func:`run_after_param`, the limit per queue, the limit. Rows
    past the limit stay locked, unclaimed, until the transaction ends."""
    qn = conn.ops.quote_name
    order = f"h.{qn('priority')} DESC, h.{qn('run_after')}, h.{qn('id')}"
    return (
        f"SELECT h.* FROM unnest({dialect(conn).array('varchar')}) AS q(name) "  # noqa: S608
        f"CROSS JOIN LATERAL (SELECT {columns} FROM {table} "
        f"WHERE {qn('status')} = %s AND {qn('queue')} = q.name AND {qn('run_after')} <= %s "
        f"ORDER BY {qn('priority')} DESC, {qn('run_after')}, {qn('id')} LIMIT %s "
        f"FOR UPDATE SKIP LOCKED) AS h ORDER BY {order} LIMIT %s"
    )


def run_after_param(model: type[Job], conn: BaseDatabaseWrapper, now: datetime) -> Any:
    """``now`` as a parameter compared with ``run_after``."""
    return model._meta.get_field("run_after").get_db_prep_value(now, conn)
