"""The dialect interface: every SQL difference of the queue is a named method or flag here.

:class:`Dialect` writes portable SQL; each database's subclass (``sqlite.py``,
``mysql.py``, ``postgresql.py``) overrides what differs there. The queue's modules ask
``dialect(conn)`` (chosen once per connection) and never test ``connection.vendor``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, TypeVar

from django.conf import settings as django_settings
from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper

from django_dbqueue.queue.dialects.rows import Done, Rows, insert_values, placeholders

if TYPE_CHECKING:
    from django.db.models import Field

_Q = TypeVar("_Q", bound=models.QuerySet[Any])


class DoneRows(NamedTuple):
    """How ``finish_done``'s UPDATE names its rows and writes their start and end times:
    ``UPDATE {target} SET ..., {started}, {finished} WHERE {where} AND ...``."""

    target: str
    target_params: list[Any]
    where: str
    where_params: list[Any]
    started: str | None  # the started_at assignment, if any
    started_params: list[Any]
    finished: str  # the finished_at assignment
    finished_params: list[Any]


class Dialect:
    """Portable SQL; a subclass per database overrides what differs there."""

    vendor: ClassVar[str] = ""
    #: ``SELECT ... FOR UPDATE SKIP LOCKED`` exists (not on SQLite, which locks the file).
    locking_reads: ClassVar[bool] = True
    #: A claim of one queue is one locking read along the claim index (PostgreSQL,
    #: MariaDB/MySQL; SQLite has no locking reads).
    locks_along_claim_index: ClassVar[bool] = False
    #: ... and a first statement takes its jobs without a concurrency key: locks,
    #: marks and reads them back (UPDATE ... RETURNING; PostgreSQL).
    claims_in_one_statement: ClassVar[bool] = False
    #: ... where a statement's round trip is at least this many seconds (0: always).
    along_index_from_round_trip: ClassVar[float] = 0.0
    #: One statement can probe an index once per element of an array parameter
    #: (``unnest(%s) CROSS JOIN LATERAL``; see :meth:`array`): PostgreSQL. The others
    #: read many queues in chunks of UNION ALL instead.
    lateral_arrays: ClassVar[bool] = False
    #: LISTEN/NOTIFY carries the wake-up (PostgreSQL).
    listen_notify: ClassVar[bool] = False
    #: A write transaction takes the write lock at BEGIN (SQLite: BEGIN IMMEDIATE).
    immediate_writes: ClassVar[bool] = False
    #: The statement that opens a transaction of raw SQL.
    begin: ClassVar[str] = "BEGIN"
    #: The placeholder of a JSON value bound as its text.
    json_placeholder: ClassVar[str] = "%s"
    #: The statement that reads the database server's clock as UTC (queue/clock.py), or
    #: "" where the database has no server (SQLite: the host's clock is the only one).
    #: Not CURRENT_TIMESTAMP: PostgreSQL's is the start of the transaction.
    clock_sql: ClassVar[str] = ""
    #: The statement that reads the server's connection limit, or "" (SQLite).
    max_connections_sql: ClassVar[str] = ""

    def array(self, kind: str) -> str:
        """The placeholder of one array parameter of SQL type ``kind`` (``lateral_arrays``)."""
        raise NotImplementedError(f"{self.vendor or 'this database'} has no array parameters")

    def ids_in(
        self, conn: BaseDatabaseWrapper, column: str, ids: list[int]
    ) -> tuple[str, list[Any]]:
        """``column IN (...)`` for a list of ids, as SQL and its parameters."""
        return f"{column} IN ({placeholders(len(ids))})", list(ids)

    def keys_in(
        self, conn: BaseDatabaseWrapper, column: str, keys: list[str]
    ) -> tuple[str, list[Any]]:
        """``column IN (...)`` for a list of strings (concurrency keys), as :meth:`ids_in`."""
        return f"{column} IN ({placeholders(len(keys))})", list(keys)

    def keyed_rows(
        self, conn: BaseDatabaseWrapper, table: str, keys: Sequence[str], by_key: str | None = None
    ) -> tuple[str, str, list[Any]]:
        """The rows of ``table`` (as ``j``) whose ``concurrency_key`` is one of ``keys``:
        (FROM and WHERE clause, the expression that tells which key a row matched, params).

        Each key matches what the database's own equality says, as a lookup of one key
        would: where strings compare exactly, ``concurrency_key IN (...)``, and the row's
        key is the key (MySQL's override compares by the column's collation).
        :func:`key_position` maps either back. ``by_key``: an index on the key, for a
        database that must be told to read it (SQLite).
        """
        column = f"j.{conn.ops.quote_name('concurrency_key')}"
        where, params = self.keys_in(conn, column, list(keys))
        return f"{table} AS j{self.indexed_by(conn, by_key)} WHERE {where}", column, params

    def indexed_by(self, conn: BaseDatabaseWrapper, index: str | None) -> str:
        """The clause after a table name that makes the planner read ``index``, where one
        must (SQLite: for the parked jobs of one key it read every queued row)."""
        return ""

    def key_order_hint(self, conn: BaseDatabaseWrapper, index: str) -> str:
        """The clause after a table name that makes a locking read walk ``index`` (a unique
        index on the key) in order, where the planner may not (MySQL)."""
        return ""

    def by_id_only(self, condition: str) -> str:
        """``condition`` (on a row found by id) written so the planner cannot read it from
        an index (PostgreSQL); unchanged elsewhere."""
        return condition

    def insert_one_sql(
        self,
        conn: BaseDatabaseWrapper,
        table: str,
        columns: str,
        values: str,
        unique: bool,
        notify: bool,
    ) -> str:
        """The one-statement INSERT of one row (``values``: its placeholders).

        ``unique``: a row that collides on a unique index is skipped, not an error
        (``ON CONFLICT DO NOTHING``). ``notify``: a ``pg_notify(%s, %s)`` per inserted
        row, which exists on PostgreSQL only. The id is read by :meth:`insert_one`.
        """
        if notify:
            raise ValueError("pg_notify exists on PostgreSQL only")
        sql = f"INSERT INTO {table} ({columns}) VALUES ({values})"  # noqa: S608
        return sql + " ON CONFLICT DO NOTHING" if unique else sql

    def one_row_cursor(self, conn: BaseDatabaseWrapper) -> CursorWrapper:
        """A cursor for :meth:`insert_one`, kept from one enqueue to the next: Django's."""
        return conn.cursor()

    def insert_one(
        self, cursor: CursorWrapper, sql: str, params: list[Any], unique: bool
    ) -> int | None:
        """Run :meth:`insert_one_sql`'s statement; the new id, or None when ``unique`` and
        the key was taken. The id is the cursor's ``lastrowid``, which costs nothing more."""
        cursor.execute(sql, params)
        if unique and cursor.rowcount == 0:  # ON CONFLICT DO NOTHING
            return None
        return int(cursor.lastrowid)

    def insert_rows(
        self,
        conn: BaseDatabaseWrapper,
        table: str,
        fields: Sequence[Field[Any, Any]],
        names: list[str],
        batches: Iterable[Rows],
        done: Done,
    ) -> list[int] | None:
        """INSERT each of ``batches`` (``names``: the quoted columns of ``fields``); see
        :func:`~django_dbqueue.queue.dialects.insert_rows`."""
        return insert_values(conn, table, names, batches, done)

    def row_converters(self, conn: BaseDatabaseWrapper, funcs: list[Any]) -> list[Any]:
        """The converters a claim's row reader (queue/reader.py) applies to a column read
        by hand: Django's own, unless the dialect has a cheaper one of the same result."""
        return funcs

    def prepare_reading(self, conn: BaseDatabaseWrapper, cursor: Any) -> None:
        """Make ready a cursor whose rows a claim reads by hand (queue/reader.py): as it
        is, unless the driver can read a column cheaper than Django has it read, to the
        same value."""

    def done_rows(
        self,
        conn: BaseDatabaseWrapper,
        table: str,
        ids: list[int],
        started: Mapping[int, Any],
        finished: Mapping[int, Any],
        now: Any,
    ) -> DoneRows:
        """The rows ``ids`` of ``finish_done``'s UPDATE; their ``started_at`` written from
        ``started`` (id: aware start time) only where it is NULL, and their
        ``finished_at`` from ``finished`` (id: aware end time; ``now`` for the others):
        a CASE of two parameters per job."""
        qn = conn.ops.quote_name
        adapt = conn.ops.adapt_datetimefield_value
        where, where_params = self.ids_in(conn, qn("id"), ids)
        ended = f"{qn('finished_at')} = %s"
        ended_params: list[Any] = [adapt(now)]
        if finished:
            whens = " ".join(["WHEN %s THEN %s"] * len(finished))
            ended = f"{qn('finished_at')} = CASE {qn('id')} {whens} ELSE %s END"
            ended_params = []
            for job_id, value in finished.items():
                ended_params += [job_id, adapt(value)]
            ended_params.append(adapt(now))
        if not started:
            return DoneRows(table, [], where, where_params, None, [], ended, ended_params)
        whens = " ".join(["WHEN %s THEN %s"] * len(started))
        assignment = (
            f"{qn('started_at')} = COALESCE({qn('started_at')}, "
            f"CASE {qn('id')} {whens} ELSE NULL END)"
        )
        params: list[Any] = []
        for job_id, value in started.items():
            params += [job_id, adapt(value)]
        return DoneRows(table, [], where, where_params, assignment, params, ended, ended_params)

    def finished_with(self, queryset: _Q, status: str) -> _Q:
        """The jobs of ``queryset`` that finished as ``status``, asked so the history index
        ``dbq_job_finished`` answers (on ``(status, finished_at)`` where it is partial)."""
        return queryset.filter(status=status, finished_at__isnull=False)

    def estimated_rows(self, conn: BaseDatabaseWrapper, table: str) -> int | None:
        """The database's own estimate of a table's row count, or None if it has none."""
        return None

    def uses_json_table(self, conn: BaseDatabaseWrapper) -> bool:
        """``JSON_TABLE`` as the queue uses it (MariaDB 10.6+; see ``mysql.py``)."""
        return False


def key_position(keys: Sequence[str]) -> dict[Any, int]:
    """What :meth:`Dialect.keyed_rows`' key expression says of each of ``keys``, to its index."""
    positions: dict[Any, int] = {}
    for index, key in enumerate(keys):
        positions[key] = positions[index + 1] = index
    return positions


def estimate(row: Sequence[Any] | None) -> int | None:
    """A row count from a statistics row, None where there is none (PostgreSQL reports -1
    for a table never analyzed or vacuumed)."""
    if row is None or row[0] is None or int(row[0]) < 0:
        return None
    return int(row[0])


def stores_utc(conn: BaseDatabaseWrapper) -> bool:
    """Datetimes go to and come from this connection in UTC (``USE_TZ``, the database's
    ``TIME_ZONE`` unset or UTC): aware on PostgreSQL, naive UTC on MySQL."""
    return bool(django_settings.USE_TZ) and conn.settings_dict.get("TIME_ZONE") in (None, "UTC")
