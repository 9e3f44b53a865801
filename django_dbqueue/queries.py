"""The SQL of the queue: claiming, finishing, renewing leases and recovery.

Every write here goes by primary key or by the indexes declared on ``Job``; every
transaction is short and never spans a job's execution. Database differences live in
:func:`claim_transaction` and nowhere else.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from django.db import connections, models, router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import F
from django.utils import timezone

from django_dbqueue.conf import settings

if TYPE_CHECKING:
    from django_dbqueue.models import Job

QUEUED, CLAIMED, DONE, FAILED, CANCELLED = "queued", "claimed", "done", "failed", "cancelled"
CLAIM_ORDER = ("-priority", "run_after", "id")


@contextmanager
def write_transaction(using: str) -> Iterator[None]:
    """A short read-then-write transaction suited to this database.

    SQLite has no ``SELECT ... FOR UPDATE``: the transaction takes the write lock at
    BEGIN (IMMEDIATE), so two writers queue on the busy timeout instead of both
    reading and one failing at once ("database is locked") when it upgrades its lock.
    """
    connection = connections[using]
    if connection.vendor != "sqlite" or connection.in_atomic_block:
        with transaction.atomic(using=using):
            yield
        return
    connection.ensure_connection()  # connecting resets transaction_mode from OPTIONS
    previous = connection.transaction_mode  # type: ignore[attr-defined]
    connection.transaction_mode = "IMMEDIATE"  # type: ignore[attr-defined]
    try:
        with transaction.atomic(using=using):
            connection.transaction_mode = previous  # type: ignore[attr-defined]
            yield
    finally:
        connection.transaction_mode = previous  # type: ignore[attr-defined]


def retry_delay(attempts: int, base: float | None = None) -> float:
    """Exponential backoff with jitter for the retry after ``attempts`` tries."""
    first = settings.RETRY_BACKOFF if base is None else base
    delay: float = min(float(settings.RETRY_BACKOFF_MAX), first * 2 ** max(attempts - 1, 0))
    jitter = float(settings.RETRY_JITTER)
    return max(0.0, delay * random.uniform(1 - jitter, 1 + jitter))


def _placeholders(count: int) -> str:
    """``%s, %s, ...``: the driver fills in the values; only the count is formatted in."""
    return ", ".join(["%s"] * count)


class RowReader(NamedTuple):
    columns: str  # quoted column list for the SELECT
    names: list[str]  # attribute names, in the same order
    converters: list[tuple[Any, list[Any]]]  # (column expression, converters) per column


_READERS: dict[tuple[type[models.Model], str], RowReader] = {}


def _row_reader(model: type[Job], conn: BaseDatabaseWrapper) -> RowReader:
    """The column list and per-column converters for reading whole Job rows by hand.

    The converters are Django's own (JSON text to data, naive MySQL and SQLite datetimes
    to aware ones...), worked out once per connection instead of once per query.
    """
    key = (model, conn.alias)
    if key not in _READERS:
        fields = model._meta.concrete_fields
        columns = ", ".join(conn.ops.quote_name(str(f.column)) for f in fields)
        converters = []
        for field in fields:
            col = field.get_col(model._meta.db_table)
            funcs = conn.ops.get_db_converters(col) + field.get_db_converters(conn)
            converters.append((col, funcs))
        _READERS[key] = RowReader(columns, [f.attname for f in fields], converters)
    return _READERS[key]


def _job_from_row(
    model: type[Job], using: str, row: Sequence[Any], reader: RowReader, conn: BaseDatabaseWrapper
) -> Job:
    values = list(row)
    for index, (col, funcs) in enumerate(reader.converters):
        if funcs and values[index] is not None:
            for func in funcs:
                values[index] = func(values[index], col, conn)
    # All concrete fields in order: from_db takes Model.__init__'s positional fast path.
    return model.from_db(using, reader.names, values)


class JobQuerySet(models.QuerySet["Job"]):
    def runnable(
        self, queues: Sequence[str] | None = None, now: datetime | None = None
    ) -> JobQuerySet:
        qs = self.filter(status=QUEUED, run_after__lte=now or timezone.now())
        if queues:
            qs = qs.filter(queue__in=list(queues))
        return qs.order_by(*CLAIM_ORDER)

    def finished(self) -> JobQuerySet:
        return self.filter(status__in=[DONE, FAILED, CANCELLED])

    # -- operator actions (the admin calls these) ----------------------------------------
    # Each write is guarded by status, so a job that changed state meanwhile (a worker
    # claimed it, finished it) is left alone instead of being overwritten. On MySQL an
    # UPDATE locks every index record it scans: call these on querysets filtered by
    # primary key (the admin works through large selections in chunks of ids).

    def requeue(self, run_now: bool = False) -> int:
        """Put failed, cancelled and done jobs back in the queue with a fresh attempt count.

        ``last_error`` and the ``errors`` history are kept so the operator can still see
        why the job failed before. ``unique_key`` stays empty: the key was released when
        the job finished. Returns how many jobs were requeued.
        """
        fields: dict[str, Any] = {
            "status": QUEUED,
            "attempts": 0,
            "owner": "",
            "owner_date": None,
            "cancel_requested": False,
            "result": None,
            "started_at": None,
            "finished_at": None,
        }
        if run_now:
            fields["run_after"] = timezone.now()
        return self.filter(status__in=[FAILED, CANCELLED, DONE]).update(**fields)

    def cancel(self) -> tuple[int, int]:
        """Cancel queued jobs and ask the workers running claimed ones to stop.

        Returns ``(cancelled, asked_to_stop)``. A claimed job is only flagged
        (``cancel_requested``): its worker stops it and records it cancelled. The rows are
        locked first so none moves between "queued" and "claimed" between the two writes
        (a job retried back to the queue in between would otherwise escape both).
        """
        now = timezone.now()
        locked = self.select_for_update().filter(status__in=[QUEUED, CLAIMED])
        with write_transaction(locked.db):  # select_for_update() routes it for writing
            list(locked.values_list("id", flat=True))
            active = self.using(locked.db).filter(status__in=[QUEUED, CLAIMED])
            cancelled = active.filter(status=QUEUED).update(
                status=CANCELLED, finished_at=now, unique_key=None, owner_date=None
            )
            asked = active.filter(status=CLAIMED).update(cancel_requested=True)
        return cancelled, asked

    def run_now(self) -> int:
        """Make queued jobs runnable at once (their ``run_after`` becomes now)."""
        return self.filter(status=QUEUED).update(run_after=timezone.now())

    def delete_unclaimed(self) -> int:
        """Delete these jobs except those a worker is running (cancel those first).

        Returns how many rows were deleted.
        """
        deleted, _ = self.exclude(status=CLAIMED).delete()
        return deleted


class JobManager(models.Manager["Job"]):
    def get_queryset(self) -> JobQuerySet:
        return JobQuerySet(self.model, using=self._db)

    def runnable(self, queues: Sequence[str] | None = None) -> JobQuerySet:
        return self.get_queryset().runnable(queues)

    def _using(self) -> str:
        return self._db or router.db_for_write(self.model)

    def claim(
        self, owner: str, batch_size: int = 100, queues: Sequence[str] | None = None
    ) -> list[Job]:
        """Claim up to ``batch_size`` runnable jobs for ``owner``.

        1. read candidate ids: a plain read that walks the claim index in order,
        2. in one short transaction, lock those ids skipping rows another claimer holds
           (re-checking the status), 3. one UPDATE by primary key, 4. COMMIT.
        On SQLite (no FOR UPDATE) all of it runs in one IMMEDIATE transaction instead.
        Attempts are counted here, so a job that kills its worker still uses one up.
        """
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        using = self._using()
        conn = connections[using]
        queue_list = list(queues or settings.QUEUES)
        for _ in range(3):
            now = timezone.now()
            if conn.vendor == "sqlite":
                with write_transaction(using):
                    candidates = self._candidate_ids(conn, queue_list, now, batch_size)
                    jobs = self._lock_and_mark(using, candidates, owner, now, lock=False)
                if jobs or not candidates:
                    return jobs
                continue
            candidates = self._candidate_ids(conn, queue_list, now, batch_size)
            if not candidates:
                return []
            with write_transaction(using):
                jobs = self._lock_and_mark(using, candidates, owner, now, lock=True)
            if jobs:
                return jobs
            # Every candidate was taken by another claimer between our read and our lock:
            # read again at once, the queue is evidently busy.
        return []

    def _candidate_ids(
        self, conn: BaseDatabaseWrapper, queues: list[str], now: datetime, limit: int
    ) -> list[int]:
        """Ids of the next runnable jobs, best first, each queue read along the claim index.

        ``queue IN (a, b)`` would make the database sort every queued row of those
        queues; one index range per queue, each stopping after ``limit`` rows, and a
        merge of at most ``limit * len(queues)`` rows keeps the cost flat.
        """
        qn = conn.ops.quote_name
        table = qn(self.model._meta.db_table)
        when = self.model._meta.get_field("run_after").get_db_prep_value(now, conn)
        order = f"{qn('priority')} DESC, {qn('run_after')}, {qn('id')}"
        one = (
            f"SELECT {qn('id')}, {qn('priority')}, {qn('run_after')} FROM {table} "  # noqa: S608
            f"WHERE {qn('status')} = %s AND {qn('queue')} = %s AND {qn('run_after')} <= %s "
            f"ORDER BY {order} LIMIT %s"
        )
        params: list[Any] = []
        for queue in queues:
            params += [QUEUED, queue, when, limit]
        if len(queues) == 1:
            sql = one
        else:
            parts = " UNION ALL ".join(
                f"SELECT * FROM ({one}) AS q{i}"  # noqa: S608
                for i in range(len(queues))
            )
            sql = f"SELECT * FROM ({parts}) AS c ORDER BY {order} LIMIT %s"  # noqa: S608
            params.append(limit)
        with conn.cursor() as cursor:
            cursor.execute(sql, params)
            return [row[0] for row in cursor.fetchall()]

    def _lock_and_mark(
        self, using: str, candidates: list[int], owner: str, now: datetime, lock: bool
    ) -> list[Job]:
        if not candidates:
            return []
        conn = connections[using]
        qn = conn.ops.quote_name
        reader = _row_reader(self.model, conn)
        sql = (
            f"SELECT {reader.columns} FROM {qn(self.model._meta.db_table)} "  # noqa: S608
            f"WHERE {qn('id')} IN ({_placeholders(len(candidates))}) "
            f"AND {qn('status')} = %s"
        )
        if lock:
            sql += " FOR UPDATE SKIP LOCKED"
        with conn.cursor() as cursor:
            cursor.execute(sql, [*candidates, QUEUED])
            rows = cursor.fetchall()
        if not rows:
            return []
        rank = {job_id: index for index, job_id in enumerate(candidates)}
        jobs = sorted(
            (_job_from_row(self.model, using, row, reader, conn) for row in rows),
            key=lambda job: rank[job.id],
        )
        ids = [job.id for job in jobs]
        sql = (
            f"UPDATE {qn(self.model._meta.db_table)} SET {qn('status')} = %s, "  # noqa: S608
            f"{qn('owner')} = %s, {qn('owner_date')} = %s, "
            f"{qn('attempts')} = {qn('attempts')} + 1 "
            f"WHERE {qn('id')} IN ({_placeholders(len(ids))})"
        )
        owner_date = self.model._meta.get_field("owner_date").get_db_prep_value(now, conn)
        with conn.cursor() as cursor:
            cursor.execute(sql, [CLAIMED, owner, owner_date, *ids])
        for job in jobs:
            job.status, job.owner, job.owner_date = CLAIMED, owner, now
            job.attempts += 1
        return jobs

    def insert_many(self, jobs: Sequence[Job], batch_size: int = 1000) -> list[Job]:
        """INSERT jobs in multi-row statements; sets their ids where the database says them.

        What ``bulk_create`` does, minus its per-value overhead: values that repeat
        (the queue, the enqueue time, an empty argument list) are prepared once.
        MariaDB, PostgreSQL and SQLite return the new ids; MySQL does not, and there the
        jobs keep ``id = None``, as with ``bulk_create``.
        """
        if not jobs:
            return []
        using = self._using()
        conn = connections[using]
        qn = conn.ops.quote_name
        fields = [f for f in self.model._meta.concrete_fields if not f.primary_key]
        columns = ", ".join(qn(f.attname) for f in fields)
        returning = bool(conn.features.can_return_rows_from_bulk_insert)
        memo: list[dict[Any, Any]] = [{} for _ in fields]
        rows: list[list[Any]] = []
        for job in jobs:
            row = []
            for index, field in enumerate(fields):
                value = getattr(job, field.attname)
                if isinstance(value, list | dict):
                    key = json.dumps(value) if value else type(value).__name__
                else:
                    key = value
                try:
                    prepared = memo[index][key]
                except KeyError:
                    prepared = memo[index][key] = field.get_db_prep_save(value, conn)
                row.append(prepared)
            rows.append(row)
        placeholder = f"({_placeholders(len(fields))})"
        table = qn(self.model._meta.db_table)
        new_ids: list[int] = []
        with conn.cursor() as cursor:
            if conn.vendor == "postgresql":
                # psycopg pipelines executemany(): one parsed statement, rows streamed.
                # A many-row VALUES list would be re-parsed client-side per chunk.
                sql = f"INSERT INTO {table} ({columns}) VALUES {placeholder} RETURNING {qn('id')}"  # noqa: S608
                raw = cursor.cursor
                raw.executemany(sql, rows, returning=True)
                while True:
                    new_ids.append(raw.fetchone()[0])
                    if not raw.nextset():
                        break
            else:
                for start in range(0, len(rows), batch_size):
                    chunk = rows[start : start + batch_size]
                    sql = (
                        f"INSERT INTO {table} ({columns}) VALUES "  # noqa: S608
                        f"{', '.join([placeholder] * len(chunk))}"
                    )
                    if returning:
                        sql += f" RETURNING {qn('id')}"
                    cursor.execute(sql, [value for row in chunk for value in row])
                    if returning:
                        new_ids += [row[0] for row in cursor.fetchall()]
        if returning:
            for job, new_id in zip(jobs, new_ids, strict=True):
                job.id = new_id
                job._state.adding, job._state.db = False, using
        return list(jobs)

    # -- finishing ---------------------------------------------------------------------

    def _owned(self, owner: str) -> JobQuerySet:
        # The guard that makes finishing exactly-once: only the current owner of a
        # claimed job may finish it, and a second identical write matches nothing.
        return self.get_queryset().using(self._using()).filter(status=CLAIMED, owner=owner)

    def finish_done(self, owner: str, jobs: Sequence[Job]) -> set[int]:
        """Record jobs as DONE in one guarded UPDATE; return the ids actually finished.

        Jobs another worker took over meanwhile (our lease ran out) are left alone. This
        runs once per batch on the hot path, so it is one statement, in autocommit,
        written by hand: the ORM spends longer building a CASE over a hundred rows than
        the database spends running it.
        """
        if not jobs:
            return set()
        using = self._using()
        conn = connections[using]
        meta = self.model._meta
        qn = conn.ops.quote_name
        now = timezone.now()
        assignments = [
            f"{qn('status')} = %s",
            f"{qn('finished_at')} = %s",
            f"{qn('unique_key')} = NULL",
            f"{qn('cancel_requested')} = %s",
        ]
        params: list[Any] = [
            DONE,
            meta.get_field("finished_at").get_db_prep_value(now, conn),
            meta.get_field("cancel_requested").get_db_prep_value(False, conn),
        ]
        for name in ("started_at", "result"):
            field = cast(models.Field[Any, Any], meta.get_field(name))
            rows = [(j.id, getattr(j, name)) for j in jobs if getattr(j, name) is not None]
            if rows:
                whens = " ".join(["WHEN %s THEN %s"] * len(rows))
                assignments.append(f"{qn(name)} = CASE {qn('id')} {whens} ELSE {qn(name)} END")
                for job_id, value in rows:
                    params += [job_id, field.get_db_prep_value(value, conn)]
        ids = [j.id for j in jobs]
        # Only quoted column names and %s placeholders are formatted in; every value
        # goes through the driver's parameters.
        sql = (
            f"UPDATE {qn(meta.db_table)} SET {', '.join(assignments)} "  # noqa: S608
            f"WHERE {qn('id')} IN ({_placeholders(len(ids))}) "
            f"AND {qn('status')} = %s AND {qn('owner')} = %s"
        )
        with conn.cursor() as cursor:
            cursor.execute(sql, [*params, *ids, CLAIMED, owner])
            updated = cursor.rowcount
        if updated == len(ids):
            finished = set(ids)
        else:
            # Some were taken over; the ones now DONE under our name are the ones we wrote.
            finished = set(
                self.get_queryset()
                .using(using)
                .filter(id__in=ids, status=DONE, owner=owner)
                .values_list("id", flat=True)
            )
        for job in jobs:
            if job.id in finished:
                job.status, job.finished_at, job.unique_key = DONE, now, None
                job.cancel_requested = False
        return finished

    def finish_failed_attempt(
        self, owner: str, job: Job, error: str, error_class: str
    ) -> str | None:
        """Record a failed attempt: back to QUEUED with backoff, or FAILED when spent.

        Returns the new status, or None when the job was no longer ours to finish.
        """
        now = timezone.now()
        errors = list(job.errors or [])
        errors.append(
            {
                "exception_class_path": error_class,
                "traceback": error,
                "at": now.isoformat(),
                "worker": owner,
            }
        )
        errors = errors[-int(settings.KEEP_ERRORS) :]
        fields: dict[str, Any] = {"last_error": error, "errors": errors, "cancel_requested": False}
        if job.started_at is not None:
            fields["started_at"] = job.started_at
        if job.attempts >= job.max_attempts:
            fields.update(status=FAILED, finished_at=now, unique_key=None)
        else:
            delay = retry_delay(job.attempts, job.retry_backoff)
            fields.update(status=QUEUED, run_after=now + timedelta(seconds=delay), owner_date=None)
        if not self._owned(owner).filter(id=job.id).update(**fields):
            return None
        for name, value in fields.items():
            setattr(job, name, value)
        return str(fields["status"])

    def give_back(self, owner: str, ids: Sequence[int]) -> int:
        """Return claimed jobs that never started: runnable at once, attempt not counted."""
        if not ids:
            return 0
        return (
            self._owned(owner)
            .filter(id__in=list(ids))
            .update(status=QUEUED, owner_date=None, attempts=F("attempts") - 1)
        )

    def cancel_claimed(self, owner: str, job: Job, reason: str) -> bool:
        now = timezone.now()
        return bool(
            self._owned(owner)
            .filter(id=job.id)
            .update(status=CANCELLED, finished_at=now, unique_key=None, last_error=reason)
        )

    # -- leases ------------------------------------------------------------------------

    def renew_leases(self, owner: str, ids: Sequence[int]) -> int:
        """Heartbeat: keep the jobs this owner knows it holds from being recovered."""
        if not ids:
            return 0
        return self._owned(owner).filter(id__in=list(ids)).update(owner_date=timezone.now())

    def retry_later(self, owner: str, job: Job, delay: float, reason: str) -> bool:
        """The job asked to run again later (RetryJob): requeue it, attempt not counted."""
        run_after = timezone.now() + timedelta(seconds=delay)
        updated = (
            self._owned(owner)
            .filter(id=job.id)
            .update(
                status=QUEUED,
                run_after=run_after,
                owner_date=None,
                attempts=F("attempts") - 1,
                last_error=f"Deferred by the job itself: {reason}",
            )
        )
        if updated:
            job.status, job.run_after, job.attempts = QUEUED, run_after, job.attempts - 1
        return bool(updated)

    def cancel_requested_ids(self, owner: str, ids: Sequence[int]) -> set[int]:
        return set(
            self._owned(owner)
            .filter(id__in=list(ids), cancel_requested=True)
            .values_list("id", flat=True)
        )

    def recover_expired(self, lease_timeout: float | None = None) -> tuple[int, int]:
        """Requeue (or fail, when attempts are spent) jobs whose owner stopped renewing.

        Returns (requeued, failed).
        """
        lease = float(settings.LEASE_TIMEOUT if lease_timeout is None else lease_timeout)
        now = timezone.now()
        cutoff = now - timedelta(seconds=lease)
        qs = self.get_queryset().using(self._using())
        expired = qs.filter(status=CLAIMED, owner_date__lt=cutoff)
        requeued = failed = 0
        with write_transaction(self._using()):
            rows = list(
                expired.select_for_update(skip_locked=True).values_list(
                    "id", "owner", "attempts", "max_attempts"
                )[:1000]
            )
            for job_id, owner, attempts, max_attempts in rows:
                message = (
                    f"Recovered at {now.isoformat()}: worker {owner} stopped renewing its "
                    f"lease (attempt {attempts} of {max_attempts} counted)."
                )
                guard = qs.filter(id=job_id, status=CLAIMED, owner=owner, owner_date__lt=cutoff)
                if attempts >= max_attempts:
                    failed += guard.update(
                        status=FAILED, finished_at=now, unique_key=None, last_error=message
                    )
                else:
                    requeued += guard.update(
                        status=QUEUED, owner_date=None, run_after=now, last_error=message
                    )
        return requeued, failed
