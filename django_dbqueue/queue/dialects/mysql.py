"""MySQL and MariaDB: strings compared by the column's collation, InnoDB's index-order
locking, no ``ON CONFLICT``, and on MariaDB 10.6+ ``JSON_TABLE`` with ``RETURNING``
(one JSON parameter in place of many: mysqlclient escapes every parameter in Python)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from django.db import IntegrityError, connections, models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper
from django.db.models import CharField
from django.db.models.expressions import RawSQL

from django_dbqueue.queue.dialects.base import Dialect, DoneRows, estimate, stores_utc
from django_dbqueue.queue.dialects.json_table import insert_json_tables
from django_dbqueue.queue.dialects.rows import Done, Rows, insert_values

if TYPE_CHECKING:
    from django.db.models import Field

_Q = TypeVar("_Q", bound=models.QuerySet[Any])


class MySQL(Dialect):
    vendor: ClassVar[str] = "mysql"
    begin: ClassVar[str] = "START TRANSACTION"
    # UTC whatever the session's time_zone; a naive datetime in UTC.
    clock_sql: ClassVar[str] = "SELECT UTC_TIMESTAMP(6)"
    max_connections_sql: ClassVar[str] = "SELECT @@max_connections"
    # One queue: one locking read along the claim index, as on PostgreSQL. In server
    # time it costs a little more than a candidate read and a locking read by primary key
    # (7.9 against 5.8 ms a claim of 100), but it is one round trip fewer, and claimers
    # never read the same candidates: 3 hosts x 4 children over 20 ms round trips
    # drained 5,567 no-op jobs/s against 1,266 taking turns (docs/benchmarks.md, "round
    # trips under injected delay").
    locks_along_claim_index: ClassVar[bool] = True
    # Only where the server is a network away, though: next to it, the walk's extra
    # server time costs more than the round trip it saves (2 workers, one queue, no
    # delay: a quarter slower than a candidate read and a locking read by primary key).
    along_index_from_round_trip: ClassVar[float] = 0.002

    def uses_json_table(self, conn: BaseDatabaseWrapper) -> bool:
        """``JSON_TABLE`` as the queue uses it (``INSERT ... SELECT ... FROM
        JSON_TABLE(...) RETURNING``; ``UPDATE JSON_TABLE(...) STRAIGHT_JOIN`` the job
        table): MariaDB 10.6+ (MySQL 8 has JSON_TABLE but no RETURNING; MariaDB 10.5 has
        RETURNING but no JSON_TABLE)."""
        return bool(
            conn.mysql_is_mariadb  # type: ignore[attr-defined]
            and conn.mysql_version >= (10, 6)  # type: ignore[attr-defined]
        )

    def keyed_rows(
        self, conn: BaseDatabaseWrapper, table: str, keys: Sequence[str], by_key: str | None = None
    ) -> tuple[str, str, list[Any]]:
        """MariaDB's default collations ignore case and trailing spaces (``"Key"`` and
        ``"key"`` share a row of ``dbqueue_concurrency`` and a limit): a derived table of
        ``(n, k)``, one row per key (its literals take the column's collation), is joined
        on the key, and ``r.n``, the key's 1-based position in ``keys``, tells which."""
        column = f"j.{conn.ops.quote_name('concurrency_key')}"
        rows = " UNION ALL ".join(["SELECT %s AS n, %s AS k", *["SELECT %s, %s"] * (len(keys) - 1)])
        params: list[Any] = []
        for n, key in enumerate(keys, 1):
            params += [n, key]
        return f"({rows}) AS r JOIN {table} j ON {column} = r.k WHERE 1 = 1", "r.n", params

    def key_order_hint(self, conn: BaseDatabaseWrapper, index: str) -> str:
        """InnoDB locks the index records it reads: for an IN list covering much of a
        small table it chose a full scan and a filesort, which would lock by id."""
        return f" FORCE INDEX ({conn.ops.quote_name(index)})"

    def insert_one_sql(
        self,
        conn: BaseDatabaseWrapper,
        table: str,
        columns: str,
        values: str,
        unique: bool,
        notify: bool,
    ) -> str:
        """No ``ON CONFLICT`` short of ``INSERT IGNORE``, which would also swallow other
        errors: a duplicate key is an error that rolls back only the statement."""
        if notify:
            raise ValueError("pg_notify exists on PostgreSQL only")
        return f"INSERT INTO {table} ({columns}) VALUES ({values})"  # noqa: S608

    def insert_one(
        self, cursor: CursorWrapper, sql: str, params: list[Any], unique: bool
    ) -> int | None:
        try:
            cursor.execute(sql, params)
            return int(cursor.lastrowid)
        except IntegrityError:
            # The key is taken. The error rolled back this statement only, so the
            # caller's transaction goes on.
            if not unique:
                raise
            return None

    def insert_rows(
        self,
        conn: BaseDatabaseWrapper,
        table: str,
        fields: Sequence[Field[Any, Any]],
        names: list[str],
        batches: Iterable[Rows],
        done: Done,
    ) -> list[int] | None:
        if self.uses_json_table(conn):
            return insert_json_tables(conn, table, fields, names, batches, done)
        return insert_values(conn, table, names, batches, done)

    def row_converters(self, conn: BaseDatabaseWrapper, funcs: list[Any]) -> list[Any]:
        """Cheaper converters of the same result for the values mysqlclient returns: 0/1
        as booleans, and where the connection stores UTC naive datetimes made aware in
        UTC (Django's ``make_aware`` checks and looks up more: 1 µs a column a job)."""
        cheaper = {conn.ops.convert_booleanfield_value.__func__: _bool}  # type: ignore[attr-defined]
        if stores_utc(conn):
            cheaper[conn.ops.convert_datetimefield_value.__func__] = _utc  # type: ignore[attr-defined]
        return [cheaper.get(getattr(func, "__func__", None), func) for func in funcs]

    def done_rows(
        self,
        conn: BaseDatabaseWrapper,
        table: str,
        ids: list[int],
        started: Mapping[int, Any],
        finished: Mapping[int, Any],
        now: Any,
    ) -> DoneRows:
        """MariaDB: the ids, start and end times as one JSON parameter whose rows are
        joined to the jobs by primary key (STRAIGHT_JOIN: in that order, so only those rows
        are read and locked). mysqlclient escapes every parameter in Python, and a CASE of
        two parameters a job cost more than the rest of the statement.

        Where the connection stores UTC (``USE_TZ``, the database's ``TIME_ZONE`` unset
        or UTC) the times go as microseconds since the epoch, turned into DATETIME by
        the server: Django's adaptation of a datetime to its text costs 4 µs, two per
        job, a tenth of a no-op job's whole cost in the worker."""
        if not self.uses_json_table(conn):
            return super().done_rows(conn, table, ids, started, finished, now)
        qn = conn.ops.quote_name
        stamp, kind, value = _time_codec(conn)
        rows = [
            [
                job_id,
                stamp(started[job_id]) if job_id in started else None,
                stamp(finished[job_id]) if job_id in finished else None,
            ]
            for job_id in ids
        ]
        target = (
            f"JSON_TABLE(%s, '$[*]' COLUMNS (job_id BIGINT PATH '$[0]', "
            f"started {kind} PATH '$[1]', finished {kind} PATH '$[2]')) AS f "
            f"STRAIGHT_JOIN {table} ON {table}.{qn('id')} = f.job_id"
        )
        started_at = f"{qn('started_at')} = COALESCE({qn('started_at')}, {value('f.started')})"
        finished_at = f"{qn('finished_at')} = COALESCE({value('f.finished')}, %s)"
        return DoneRows(
            target,
            [json.dumps(rows)],
            "f.job_id IS NOT NULL",
            [],
            started_at,
            [],
            finished_at,
            [conn.ops.adapt_datetimefield_value(now)],
        )

    def finished_with(self, queryset: _Q, status: str) -> _Q:
        """The index is on the virtual column ``finished_status``, the status of a finished
        job and NULL before (migration 0009, so that claims do not write it): the
        condition names that column, which no model field describes. Not ``status = %s``
        as well: the index does not hold the status column, and InnoDB would read each
        row to test it."""
        qn = connections[queryset.db].ops.quote_name
        column = f"{qn(queryset.model._meta.db_table)}.{qn('finished_status')}"
        finished = RawSQL(column, (), CharField())
        return queryset.alias(finished_status=finished).filter(finished_status=status)

    def estimated_rows(self, conn: BaseDatabaseWrapper, table: str) -> int | None:
        with conn.cursor() as cursor:
            cursor.execute(
                "SELECT table_rows FROM information_schema.tables "
                "WHERE table_schema = DATABASE() AND table_name = %s",
                [table],
            )
            return estimate(cursor.fetchone())


def _micros(value: datetime) -> int:
    """An aware datetime as whole microseconds since the epoch (exact: a float of
    seconds near 2026 holds a quarter of a microsecond)."""
    return round(value.timestamp() * 1_000_000)


def _time_codec(
    conn: BaseDatabaseWrapper,
) -> tuple[Callable[[datetime], Any], str, Callable[[str], str]]:
    """How ``done_rows`` sends a time in its JSON: (Python value, JSON_TABLE column type,
    the SQL that makes a DATETIME of the column). Microseconds since the epoch where the
    connection stores UTC; else Django's own text of the datetime."""
    if stores_utc(conn):
        return _micros, "BIGINT", _from_micros
    return conn.ops.adapt_datetimefield_value, "DATETIME(6)", str


def _from_micros(column: str) -> str:
    # Deterministic (no session time zone, no clock): fine for replication and Galera.
    return f"TIMESTAMPADD(MICROSECOND, {column}, '1970-01-01 00:00:00')"


def _utc(value: datetime, expression: Any, connection: Any) -> datetime:
    return value.replace(tzinfo=UTC)


def _bool(value: Any, expression: Any, connection: Any) -> Any:
    return bool(value) if value in (0, 1) else value
