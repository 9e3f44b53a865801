"""PostgreSQL: array parameters (one parse psycopg caches), ``RETURNING``, ``ON CONFLICT``,
NOTIFY in the INSERT, ``unnest`` for multi-row inserts, a planner that needs steering."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from functools import cache
from typing import TYPE_CHECKING, Any, ClassVar

from django.conf import settings as django_settings
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorDebugWrapper, CursorWrapper
from django.db.models import JSONField

from django_dbqueue.queue.dialects.base import Dialect, DoneRows, estimate, stores_utc
from django_dbqueue.queue.dialects.rows import Done, Rows

if TYPE_CHECKING:
    from django.db.models import Field


class PostgreSQL(Dialect):
    vendor: ClassVar[str] = "postgresql"
    # A claim of one queue is one locking read along the claim index (``ORDER BY ...
    # LIMIT n FOR UPDATE SKIP LOCKED``) rather than a plain read of candidate ids and a
    # locking read of those by primary key: here it is the cheaper of the two (7.8
    # against 11.6 ms a claim of 100 jobs) and claimers no longer read the same
    # candidates (two workers draining one queue spent a third of their locking reads on
    # rows the other had just taken). MariaDB/MySQL too (dialects/mysql.py).
    locks_along_claim_index: ClassVar[bool] = True
    claims_in_one_statement: ClassVar[bool] = True
    lateral_arrays: ClassVar[bool] = True
    listen_notify: ClassVar[bool] = True
    # JSON is bound as text with a cast (enqueue has the text already).
    json_placeholder: ClassVar[str] = "%s::jsonb"
    # The time now, not the transaction's start (now(), CURRENT_TIMESTAMP).
    clock_sql: ClassVar[str] = "SELECT clock_timestamp()"
    max_connections_sql: ClassVar[str] = "SHOW max_connections"

    def array(self, kind: str) -> str:
        return f"%s::{kind}[]"

    def ids_in(
        self, conn: BaseDatabaseWrapper, column: str, ids: list[int]
    ) -> tuple[str, list[Any]]:
        """``column = ANY(%s)``, the ids one array parameter. psycopg caches the parsing of
        a statement only up to 50 parameters: a claim of 100 ids as 100 placeholders was
        parsed again, in Python, at every claim and every finish. And ``column BETWEEN``
        the least and the greatest id, which changes no result: with statistics taken
        while the table was empty (a queue drained, then vacuumed), the planner priced a
        hundred primary-key probes above a sequential scan of the whole table, and every
        claim and finish of a 20,000-job drain read all 20,000 rows (10.8 ms against 1.6
        ms a statement). A range on the key makes the index path the cheap one.
        """
        if not ids:
            return f"{column} = ANY(%s::bigint[])", [ids]
        return f"({column} = ANY(%s::bigint[]) AND {column} BETWEEN %s AND %s)", [
            ids,
            min(ids),
            max(ids),
        ]

    def keys_in(
        self, conn: BaseDatabaseWrapper, column: str, keys: list[str]
    ) -> tuple[str, list[Any]]:
        return f"{column} = ANY(%s::varchar[])", [keys]

    def by_id_only(self, condition: str) -> str:
        """PostgreSQL plans from statistics: taken while the table held mostly finished
        jobs, they call QUEUED and CLAIMED rare, and ``WHERE id = ANY(...) AND status =
        'queued'`` then walks every queued entry of a status index (and every dead one)
        to find a hundred ids instead of looking them up by primary key. ``(...) IS
        TRUE`` is the same test (the columns are NOT NULL) that no index answers. (MySQL
        estimates ranges by reading the index, SQLite prefers the primary key.)"""
        return f"({condition}) IS TRUE"

    def insert_one_sql(
        self,
        conn: BaseDatabaseWrapper,
        table: str,
        columns: str,
        values: str,
        unique: bool,
        notify: bool,
    ) -> str:
        """Returns the id (``RETURNING``), with ``notify`` also a ``pg_notify(%s, %s)`` per
        inserted row: NOTIFY is transactional, so the wake-up needs no statement of its
        own and goes out on commit. ``ON CONFLICT DO NOTHING``: PostgreSQL aborts a
        transaction on an error, so the alternative is a savepoint round trip around
        every insert."""
        sql = f"INSERT INTO {table} ({columns}) VALUES ({values})"  # noqa: S608
        if unique:
            sql += " ON CONFLICT DO NOTHING"
        sql += f" RETURNING {conn.ops.quote_name('id')}"
        return sql + ", pg_notify(%s, %s)" if notify else sql

    def one_row_cursor(self, conn: BaseDatabaseWrapper) -> CursorWrapper:
        """With psycopg 3, a cursor that binds the parameters on the server (Django's own
        with ``OPTIONS["server_side_binding"]``), made as ``conn.cursor()`` makes one
        (the health check, the connection, the wrapper with its execute wrappers and
        error mapping): psycopg sends the statement and its values as they are instead
        of quoting 18 values into a new text in Python. Where the project allows
        prepared statements (``OPTIONS["prepare_threshold"]``, which Django leaves off
        for the poolers that cannot keep them) the INSERT is prepared after that many
        enqueues, and the server no longer parses and plans it each time."""
        try:
            import psycopg
        except ImportError:  # psycopg2
            return conn.cursor()
        conn.close_if_health_check_failed()
        conn.ensure_connection()
        driver = conn.connection
        if not isinstance(driver, psycopg.Connection):
            return conn.cursor()
        conn.validate_thread_sharing()
        with conn.wrap_database_errors:
            raw = psycopg.Cursor(driver)
        wrapper = CursorDebugWrapper if conn.queries_logged else CursorWrapper
        return wrapper(raw, conn)

    def insert_one(
        self, cursor: CursorWrapper, sql: str, params: list[Any], unique: bool
    ) -> int | None:
        cursor.execute(sql, params)
        row = cursor.fetchone()
        return None if row is None else int(row[0])

    def insert_rows(
        self,
        conn: BaseDatabaseWrapper,
        table: str,
        fields: Sequence[Field[Any, Any]],
        names: list[str],
        batches: Iterable[Rows],
        done: Done,
    ) -> list[int] | None:
        """``INSERT ... SELECT ... FROM unnest(%s, %s, ...)``, one array per column that
        varies (server-side binding: the arrays are not rendered into the SQL)."""
        new_ids: list[int] = []
        for rows in batches:
            ids = _insert_unnest(conn, table, fields, names, rows)
            done(rows.offset, rows.offset + rows.count, ids)
            new_ids += ids
        return new_ids

    def prepare_reading(self, conn: BaseDatabaseWrapper, cursor: Any) -> None:
        """psycopg 3 reads ``timestamptz`` with its own loader (in C in its binary and C
        builds) where the connection stores UTC: Django registers a Python subclass of
        psycopg's Python loader on its connections to set the time zone, 8 µs a value
        against 0.5 µs, and a claimed job has two. In UTC both give the same aware
        datetime; elsewhere, and with psycopg2, Django's stays."""
        adapters = getattr(getattr(cursor, "cursor", None), "adapters", None)
        if adapters is not None and stores_utc(conn):
            adapters.register_loader(*_psycopg_timestamptz_loader())

    def done_rows(
        self,
        conn: BaseDatabaseWrapper,
        table: str,
        ids: list[int],
        started: Mapping[int, Any],
        finished: Mapping[int, Any],
        now: Any,
    ) -> DoneRows:
        """Start and end times as arrays beside the ids: a statement of fixed text, whose
        parse psycopg caches, where a CASE of 2 parameters per job is parsed anew.

        With ``USE_TZ`` (aware times) the ids and times go as text, microseconds since
        the epoch joined by commas: psycopg dumps a list element by element in Python,
        and the server parses a timestamp's text, 8 µs a job for each array of times
        (measured: 815 µs for 100 of them against 87 µs as one text of integers)."""
        qn = conn.ops.quote_name
        where, where_params = self.ids_in(conn, qn("id"), ids)
        key: Any
        made: Callable[[str], str]
        if not django_settings.USE_TZ:
            position = f"[array_position(%s::bigint[], {qn('id')})]"
            times, key, made = "(%s::timestamptz[])", ids, str
            starts: Any = [started.get(job_id) for job_id in ids]
            ends: Any = [finished.get(job_id) for job_id in ids]
        else:
            position = f"[array_position(string_to_array(%s, ',')::bigint[], {qn('id')})]"
            times, key, made = "(string_to_array(%s, ',', '')::bigint[])", _joined(ids), _epoch
            starts, ends = _micros_text(ids, started), _micros_text(ids, finished)
        assignment = f"{qn('started_at')} = COALESCE({qn('started_at')}, {made(times + position)})"
        ended = f"{qn('finished_at')} = COALESCE({made(times + position)}, %s)"
        return DoneRows(
            table, [], where, where_params, assignment, [starts, key], ended, [ends, key, now]
        )

    def estimated_rows(self, conn: BaseDatabaseWrapper, table: str) -> int | None:
        with conn.cursor() as cursor:
            cursor.execute(
                "SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass", [table]
            )
            return estimate(cursor.fetchone())


def _insert_unnest(
    conn: BaseDatabaseWrapper,
    table: str,
    fields: Sequence[Field[Any, Any]],
    names: list[str],
    chunk: Rows,
) -> list[int]:
    import psycopg  # the driver of this database only: not every install has it

    select: list[str] = []
    arrays: list[str] = []
    params: list[Any] = []
    array_names: list[str] = []
    for index, (field, column, varies) in enumerate(
        zip(fields, chunk.columns, chunk.varying, strict=True)
    ):
        is_json = isinstance(field, JSONField)
        db_type = "text" if is_json else field.db_type(conn)
        cast = "::jsonb" if is_json else ""
        if varies:
            arrays.append(f"%s::{db_type}[]")
            array_names.append(f"c{index}")
            select.append(f"u.c{index}{cast}")
        else:
            select.append(f"%s::{db_type}{cast}")
            params.append(column)
    if arrays:
        source = (
            f"unnest({', '.join(arrays)}) WITH ORDINALITY AS u({', '.join(array_names)}, n) "
            "ORDER BY u.n"
        )
        params += chunk.varying_values()
    else:
        source = "generate_series(1, %s) AS u(n) ORDER BY u.n"
        params.append(chunk.count)
    sql = (
        f"INSERT INTO {table} ({', '.join(names)}) "  # noqa: S608
        f"SELECT {', '.join(select)} FROM {source} RETURNING {conn.ops.quote_name('id')}"
    )
    conn.ensure_connection()
    # Server-side binding: Django's cursors render parameters into the SQL text.
    with psycopg.Cursor(conn.connection) as cursor:
        cursor.execute(sql, params)
        return [row[0] for row in cursor.fetchall()]


def _joined(numbers: Iterable[int | None]) -> str:
    """Integers as one text parameter (``string_to_array(%s, ',', '')``: '' is NULL)."""
    return ",".join("" if n is None else str(n) for n in numbers)


def _micros_text(ids: list[int], times: Mapping[int, datetime]) -> str:
    """Each job's time (aware) as microseconds since the epoch, in the order of ``ids``."""
    return _joined(
        round(times[job_id].timestamp() * 1_000_000) if job_id in times else None for job_id in ids
    )


def _epoch(micros: str) -> str:
    # An absolute instant: no session time zone takes part.
    return f"(TIMESTAMPTZ 'epoch' + {micros} * INTERVAL '1 microsecond')"


@cache
def _psycopg_timestamptz_loader() -> tuple[int, Any]:
    """psycopg's own text loader of ``timestamptz`` (its default adapters', which
    Django's connections override): (the type's oid, the loader class)."""
    import psycopg
    from psycopg.pq import Format

    oid = psycopg.adapters.types["timestamptz"].oid
    return oid, psycopg.adapters.get_loader(oid, Format.TEXT)
