"""What the database does with the queue's own statements and no Django: the yardstick
``dbqueue_bench`` puts beside its figures (``--only raw``).

Each loop sends through the database driver's own connection what the queue sends for
the same work, built once before the clock starts: no ORM, no validation, no Job
objects, no wake-up, no heartbeats. The enqueues replay the INSERT that ``enqueue()``
sent for a no-op job; the drain runs the claim of queue/claim.py statement for
statement and records each batch DONE as queue/finish.py does (which also keeps each
job's start time). The queue's figure as a share of these is its overhead on this
machine and server, whatever their speed. Server databases only.

Replaying our own statements cannot show that the statements themselves cost. So beside
them runs a second yardstick, the simplest correct batch claim (:func:`simple_drain`,
``simple_drain_per_s``): a locking read of a batch of queued ids (100) in id order with ``SKIP
LOCKED``, one UPDATE to claim them, COMMIT, one UPDATE to done - what a queue that knows
nothing of queues, priorities, ``run_after``, leases or concurrency keys sends.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

from django.db import connections, router
from django.utils import timezone

from django_dbqueue.bench.runs import noop, wait_for_purge
from django_dbqueue.bulk import enqueue_many
from django_dbqueue.enqueueing import enqueue
from django_dbqueue.models import Job
from django_dbqueue.queue.dialects import by_id_only, has_json_table, ids_in, placeholders
from django_dbqueue.queue.reader import row_reader
from django_dbqueue.status import CLAIMED, DONE, QUEUED

BULK_ROWS = 1000  # rows per INSERT, as enqueue_many's default batch
RAW_OWNER = "dbqueue-bench-raw"


@contextmanager
def _driver_connection(using: str) -> Iterator[Any]:
    """The driver's own connection of a new Django connection to ``using``: set up as
    Django sets up every connection (on MySQL/MariaDB its isolation level, READ
    COMMITTED by default: InnoDB's REPEATABLE READ locks gaps, and two claimers then
    deadlock) and in autocommit; transactions are begun and committed by statements, as
    the queue's are. Closed on leaving."""
    wrapper = connections.create_connection(using)
    try:
        wrapper.ensure_connection()
        yield wrapper.connection
    finally:
        wrapper.close()


def _recorded_insert(using: str) -> tuple[str, list[Any]]:
    """The INSERT (and its parameters) that ``enqueue()`` of a no-op job sends: one
    enqueue is run and its statement recorded."""
    seen: list[tuple[str, list[Any]]] = []

    def record(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if sql.startswith("INSERT"):
            seen.append((sql, list(params)))
        return execute(sql, params, many, context)

    with connections[using].execute_wrapper(record):
        enqueue(noop)
    Job.objects.using(using).all().delete()
    if len(seen) != 1:
        raise RuntimeError(f"enqueue() sent {len(seen)} INSERTs, not one")
    return seen[0]


def _statement(raw: Any, vendor: str, sql: str, params: list[Any]) -> str:
    """The statement's text with its parameters quoted in, once, by the driver: the
    database's work is what is timed, not the client's quoting (mysqlclient quotes
    every parameter in Python at every execute; psycopg adapts each of a multi-row
    INSERT's 15,000 parameters)."""
    if vendor == "mysql":
        return str(raw.cursor().mogrify(sql, params))
    import psycopg

    return str(psycopg.ClientCursor(raw).mogrify(sql, params))


def raw_enqueue_single(count: int, bound: bool = False) -> float:
    """``count`` times the INSERT of ``enqueue()``, each its own (autocommitted)
    transaction (on PostgreSQL with its NOTIFY, which is part of the statement).

    ``bound``: the driver binds the parameters at each execute, as any caller that is
    not handed a finished text does (mysqlclient quotes each value in Python; psycopg
    sends them apart, for the server to bind). The share of the other's rate is the
    most a caller of the driver can reach with enqueue's values."""
    using = router.db_for_write(Job)
    sql, params = _recorded_insert(using)
    with _driver_connection(using) as raw:
        cursor = raw.cursor()
        text = _statement(raw, connections[using].vendor, sql, params)
        sent: tuple[Any, ...] = (sql, params) if bound else (text,)
        started = time.perf_counter()
        for _ in range(count):
            cursor.execute(*sent)
            if cursor.description:
                cursor.fetchall()
        elapsed = time.perf_counter() - started
    return count / elapsed


def raw_enqueue_bulk(count: int) -> float:
    """``count`` rows of ``enqueue()``'s INSERT in multi-row INSERTs of
    :data:`BULK_ROWS` (each returning the new ids on PostgreSQL), in one transaction."""
    using = router.db_for_write(Job)
    vendor = connections[using].vendor
    sql, params = _recorded_insert(using)
    head, values = sql.split(" VALUES ", 1)
    group = values[: values.index(")") + 1]  # the row's placeholders: "(%s, %s, ...)"
    row = params[: group.count("%s")]  # (without pg_notify's)
    returning = " RETURNING id" if vendor == "postgresql" else ""
    with _driver_connection(using) as raw:
        cursor = raw.cursor()
        batches = []
        for rows in [BULK_ROWS] * (count // BULK_ROWS) + [count % BULK_ROWS]:
            if rows:
                multi = f"{head} VALUES {', '.join([group] * rows)}{returning}"
                batches.append(_statement(raw, vendor, multi, row * rows))
        started = time.perf_counter()
        cursor.execute("BEGIN")
        for text in batches:
            cursor.execute(text)
            if cursor.description:
                cursor.fetchall()
        cursor.execute("COMMIT")
        elapsed = time.perf_counter() - started
    return count / elapsed


class _Statements:
    """The drain's statements on one server, as the queue sends them for one queue."""

    def __init__(self, using: str, queue: str, batch_size: int) -> None:
        conn = connections[using]
        qn = conn.ops.quote_name
        self.vendor = conn.vendor
        self.batch_size = batch_size
        self.queue = queue
        table = qn(Job._meta.db_table)
        order = f"{qn('priority')} DESC, {qn('run_after')}, {qn('id')}"
        runnable = f"{qn('status')} = %s AND {qn('queue')} = %s AND {qn('run_after')} <= %s"
        columns = row_reader(Job, conn).columns
        self.begin = "START TRANSACTION" if self.vendor == "mysql" else "BEGIN"
        # MySQL/MariaDB: a plain read of candidate ids, then a locking read of those ids
        # (queue/claim.py); PostgreSQL: one locking read along the claim index.
        # {skip}: past the ids another process was seen taking, as claim.py reads again.
        self.candidates = (
            f"SELECT {qn('id')} FROM {table} WHERE {runnable} {{skip}}"  # noqa: S608
            f"ORDER BY {order} LIMIT %s"
        )
        self.lock_next = (
            f"SELECT {columns} FROM {table} WHERE {runnable} "  # noqa: S608
            f"ORDER BY {order} LIMIT %s FOR UPDATE SKIP LOCKED"
        )
        self.lock_ids = (
            f"SELECT {columns} FROM {table} WHERE {{ids}} AND "  # noqa: S608
            f"{by_id_only(conn, qn('status') + ' = %s')} AND {qn('run_after')} <= %s "
            "FOR UPDATE SKIP LOCKED"
        )
        self.mark = (
            f"UPDATE {table} SET {qn('status')} = %s, {qn('owner')} = %s, "  # noqa: S608
            f"{qn('owner_date')} = %s, {qn('attempts')} = {qn('attempts')} + 1 WHERE {{ids}}"
        )
        guard = by_id_only(conn, f"{qn('status')} = %s AND {qn('owner')} = %s")
        done = (
            f"{qn('status')} = %s, {qn('finished_at')} = %s, "
            f"{qn('unique_key')} = NULL, {qn('cancel_requested')} = %s"
        )
        # The finish of queue/finish.py: on MariaDB the ids as one JSON parameter joined
        # to the rows by primary key.
        self.json_ids = has_json_table(conn)
        if self.json_ids:
            target = (
                "JSON_TABLE(%s, '$[*]' COLUMNS (job_id BIGINT PATH '$')) AS f "
                f"STRAIGHT_JOIN {table} ON {table}.{qn('id')} = f.job_id"
            )
            self.finish = f"UPDATE {target} SET {done} WHERE f.job_id IS NOT NULL AND {guard}"  # noqa: S608
        else:
            self.finish = f"UPDATE {table} SET {done} WHERE {{ids}} AND {guard}"  # noqa: S608
        self.conn = conn
        self.false = Job._meta.get_field("cancel_requested").get_db_prep_value(False, conn)

    def skip(self, taken: list[int]) -> str:
        return f"AND {self.conn.ops.quote_name('id')} NOT IN ({placeholders(len(taken))}) "

    def ids_in(self, ids: list[int]) -> tuple[str, list[Any]]:
        return ids_in(self.conn, self.conn.ops.quote_name("id"), ids)

    def now(self) -> Any:
        return self.conn.ops.adapt_datetimefield_value(timezone.now())


def _drain_loop(
    using: str, drain: Any, statements: Any, start: Any, taken: Any, index: int
) -> None:
    """One process: waits for the start, then drains with ``drain(statements, cursor,
    owner)``, which returns how many jobs it took (kept at ``taken[index]``); exits."""
    with _driver_connection(using) as raw:
        start.wait()
        taken[index] = drain(statements, raw.cursor(), f"{RAW_OWNER}:{os.getpid()}")
    os._exit(0)


def _drain(s: _Statements, cursor: Any, owner: str) -> int:
    """Claim a batch, record it done, until nothing runnable is left."""
    taken: list[int] = []
    drained = 0
    while True:
        now = s.now()
        if s.vendor == "mysql":
            # Twice the batch: the second half is locked if another process holds the first.
            sql = s.candidates.format(skip=s.skip(taken) if taken else "")
            cursor.execute(sql, [QUEUED, s.queue, now, *taken, 2 * s.batch_size])
            candidates = [row[0] for row in cursor.fetchall()]
            if not candidates:
                break
            cursor.execute(s.begin)
            for half in (candidates[: s.batch_size], candidates[s.batch_size :]):
                if half:
                    where, params = s.ids_in(half)
                    cursor.execute(s.lock_ids.format(ids=where), [*params, QUEUED, now])
                    rows = cursor.fetchall()
                    if rows:
                        break
        else:
            cursor.execute(s.begin)
            cursor.execute(s.lock_next, [QUEUED, s.queue, now, s.batch_size])
            rows = cursor.fetchall()
        ids = [row[0] for row in rows]
        if ids:
            where, params = s.ids_in(ids)
            cursor.execute(s.mark.format(ids=where), [CLAIMED, owner, now, *params])
        cursor.execute("COMMIT")
        if not ids:
            if s.vendor == "mysql":
                taken += candidates  # another process holds them: read past them
                continue
            return drained
        taken.clear()
        drained += len(ids)
        finished = [DONE, s.now(), s.false]
        if s.json_ids:
            cursor.execute(s.finish, [json.dumps(ids), *finished, CLAIMED, owner])
        else:
            cursor.execute(s.finish.format(ids=where), [*finished, *params, CLAIMED, owner])
    return drained


class Drained(NamedTuple):
    per_s: float  # jobs drained per second, from the processes' common start
    taken: list[int]  # jobs each process took


def _timed_drain(count: int, workers: int, queue: str, drain: Any, statements: Any) -> Drained:
    """``workers`` processes running ``drain`` over ``count`` queued no-op jobs, timed
    from their common start to the last one's end. Raises RuntimeError unless every job
    ended DONE and the processes took ``count`` jobs between them: then none was taken
    twice."""
    using = router.db_for_write(Job)
    wait_for_purge(using)
    enqueue_many({"task": noop, "queue": queue} for _ in range(count))
    connections.close_all()
    ctx = multiprocessing.get_context("fork")
    start = ctx.Event()
    taken = ctx.Array("q", workers)
    processes = [
        ctx.Process(target=_drain_loop, args=(using, drain, statements, start, taken, index))
        for index in range(workers)
    ]
    for process in processes:
        process.start()
    time.sleep(0.5)  # every process connected and waiting
    started = time.perf_counter()
    start.set()
    for process in processes:
        process.join()
    elapsed = time.perf_counter() - started
    each = [int(taken[index]) for index in range(workers)]
    done = Job.objects.using(using).filter(status=DONE).count()
    if done != count or sum(each) != count or any(p.exitcode for p in processes):
        raise RuntimeError(f"drain incomplete: {done} of {count} done, {sum(each)} taken")
    return Drained(count / elapsed, each)


def raw_drain(count: int, workers: int, batch_size: int, queue: str) -> float:
    """``workers`` processes draining ``count`` queued no-op jobs with the queue's claim
    and finish statements."""
    statements = _Statements(router.db_for_write(Job), queue, batch_size)
    return _timed_drain(count, workers, queue, _drain, statements).per_s


class _Simple:
    """The simplest batch claim's statements (on the job table, whose other columns
    keep what enqueue_many gave them)."""

    def __init__(self, using: str, batch_size: int) -> None:
        conn = connections[using]
        qn = conn.ops.quote_name
        table, status = qn(Job._meta.db_table), qn("status")
        self.conn = conn
        self.batch_size = batch_size
        self.begin = "START TRANSACTION" if conn.vendor == "mysql" else "BEGIN"
        self.lock = (
            f"SELECT {qn('id')} FROM {table} WHERE {status} = %s "  # noqa: S608
            f"ORDER BY {qn('id')} LIMIT %s FOR UPDATE SKIP LOCKED"
        )
        self.mark = f"UPDATE {table} SET {status} = %s WHERE {{ids}}"  # noqa: S608

    def ids_in(self, ids: list[int]) -> tuple[str, list[Any]]:
        return ids_in(self.conn, self.conn.ops.quote_name("id"), ids)


def _simple(s: _Simple, cursor: Any, owner: str) -> int:
    """Lock a batch, claim it, commit, record it done, until a locking read finds
    nothing (every job taken, or locked by another process that takes it)."""
    drained = 0
    while True:
        cursor.execute(s.begin)
        cursor.execute(s.lock, [QUEUED, s.batch_size])
        ids = [row[0] for row in cursor.fetchall()]
        if ids:
            where, params = s.ids_in(ids)
            cursor.execute(s.mark.format(ids=where), [CLAIMED, *params])
        cursor.execute("COMMIT")
        if not ids:
            return drained
        cursor.execute(s.mark.format(ids=where), [DONE, *params])
        drained += len(ids)


def simple_drain(count: int, workers: int, batch_size: int, queue: str) -> Drained:
    """``workers`` processes draining ``count`` queued no-op jobs with the simplest batch
    claim (the module's docstring), in batches of the queue's size (100 by default)."""
    statements = _Simple(router.db_for_write(Job), batch_size)
    return _timed_drain(count, workers, queue, _simple, statements)
