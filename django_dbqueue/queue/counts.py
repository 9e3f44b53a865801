"""Per-queue figures for the dashboard in a few statements, however many queues exist.

Each figure reads one bounded index range (a count stops after ``limit + 1`` rows of
the (status, queue) prefix of ``dbq_job_claim``), and the ranges of many queues go
into one statement: an array and LATERAL on PostgreSQL, chunks of UNION ALL elsewhere
(SQLite allows 500 terms per compound SELECT). 400 queues took 2,406 queries when
each figure was a query of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import connections

from django_dbqueue.queue.dialects import dialect
from django_dbqueue.status import QUEUED

if TYPE_CHECKING:
    from django_dbqueue.models import Job

# UNION ALL branches per statement where there are no arrays.
BRANCHES_PER_STATEMENT = 100


def capped_counts(
    model: type[Job], using: str, queues: Sequence[str], statuses: Sequence[str], limit: int
) -> dict[tuple[str, str], int]:
    """{(queue, status): count}, each count stopping at ``limit + 1``."""
    conn = connections[using]
    qn = conn.ops.quote_name
    table = qn(model._meta.db_table)
    pairs = [(queue, status) for queue in queues for status in statuses]
    if not pairs:
        return {}
    speaks = dialect(conn)
    if speaks.lateral_arrays:
        names = speaks.array("varchar")
        sql = (
            "SELECT p.k, (SELECT COUNT(*) FROM ("  # noqa: S608
            f"SELECT 1 FROM {table} WHERE {qn('status')} = p.s AND {qn('queue')} = p.q "
            f"LIMIT %s) AS t) FROM unnest({names}, {names}) "
            "WITH ORDINALITY AS p(q, s, k)"
        )
        params: list[Any] = [limit + 1, [p[0] for p in pairs], [p[1] for p in pairs]]
        with conn.cursor() as cursor:
            cursor.execute(sql, params)
            return {pairs[int(k) - 1]: int(n) for k, n in cursor.fetchall()}
    found: dict[tuple[str, str], int] = {}
    for start in range(0, len(pairs), BRANCHES_PER_STATEMENT):
        chunk = pairs[start : start + BRANCHES_PER_STATEMENT]
        # The branch number is formatted in (our own loop counter, not a value), so the
        # rows say which pair they count without a typed string parameter per branch.
        sql = " UNION ALL ".join(
            f"SELECT {i} AS k, COUNT(*) AS n FROM ("  # noqa: S608
            f"SELECT 1 AS one FROM {table} WHERE {qn('status')} = %s AND {qn('queue')} = %s "
            f"LIMIT %s) AS t{i}"
            for i in range(len(chunk))
        )
        params = []
        for queue, status in chunk:
            params += [status, queue, limit + 1]
        with conn.cursor() as cursor:
            cursor.execute(sql, params)
            found.update({chunk[int(k)]: int(n) for k, n in cursor.fetchall()})
    return found


def oldest_runnable(
    model: type[Job], using: str, queues: Sequence[str], now: datetime
) -> dict[str, tuple[int, datetime]]:
    """{queue: (id, run_after)} of the job each queue has kept waiting longest.

    Waiting longest = runnable for longest: the queue's runnable range of the claim
    index, i.e. the backlog, never the history.
    """
    if not queues:
        return {}
    conn = connections[using]
    qn = conn.ops.quote_name
    table = qn(model._meta.db_table)
    run_after = model._meta.get_field("run_after")
    when = run_after.get_db_prep_value(now, conn)
    where = f"{qn('status')} = %s AND {qn('queue')} = {{queue}} AND {qn('run_after')} <= %s"
    order = f"ORDER BY {qn('run_after')}, {qn('id')} LIMIT 1"
    rows: list[tuple[Any, ...]] = []
    speaks = dialect(conn)
    if speaks.lateral_arrays:
        sql = (
            f"SELECT q.name, o.{qn('id')}, o.{qn('run_after')} "  # noqa: S608
            f"FROM unnest({speaks.array('varchar')}) AS q(name) CROSS JOIN LATERAL ("
            f"SELECT {qn('id')}, {qn('run_after')} FROM {table} "
            f"WHERE {where.format(queue='q.name')} {order}) AS o"
        )
        with conn.cursor() as cursor:
            cursor.execute(sql, [list(queues), QUEUED, when])
            rows = list(cursor.fetchall())
    else:
        for start in range(0, len(queues), BRANCHES_PER_STATEMENT):
            chunk = list(queues[start : start + BRANCHES_PER_STATEMENT])
            sql = " UNION ALL ".join(
                f"SELECT * FROM (SELECT {i} AS k, {qn('id')}, {qn('run_after')} "  # noqa: S608
                f"FROM {table} WHERE {where.format(queue='%s')} {order}) AS o{i}"
                for i in range(len(chunk))
            )
            params: list[Any] = []
            for queue in chunk:
                params += [QUEUED, queue, when]
            with conn.cursor() as cursor:
                cursor.execute(sql, params)
                rows += [(chunk[int(k)], job_id, at) for k, job_id, at in cursor.fetchall()]
    found: dict[str, tuple[int, datetime]] = {}
    converters = conn.ops.get_db_converters(run_after.get_col(model._meta.db_table))
    for queue, job_id, at in rows:
        for convert in converters:
            at = convert(at, run_after.get_col(model._meta.db_table), conn)
        found[queue] = (int(job_id), at)
    return found
