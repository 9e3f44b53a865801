"""Every difference between MySQL/MariaDB, PostgreSQL and SQLite that the queue's SQL meets."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper


def placeholders(count: int) -> str:
    """``%s, %s, ...``: the driver fills in the values; only the count is formatted in."""
    return ", ".join(["%s"] * count)


def ids_in(conn: BaseDatabaseWrapper, column: str, ids: list[int]) -> tuple[str, list[Any]]:
    """``column IN (...)`` for a list of ids, as SQL and its parameters.

    PostgreSQL: ``column = ANY(%s)``, the ids one array parameter. psycopg caches the
    parsing of a statement only up to 50 parameters: a claim of 100 ids as 100
    placeholders was parsed again, in Python, at every claim and every finish.
    """
    if conn.vendor == "postgresql":
        return f"{column} = ANY(%s::bigint[])", [ids]
    return f"{column} IN ({placeholders(len(ids))})", list(ids)


def by_id_only(conn: BaseDatabaseWrapper, condition: str) -> str:
    """``condition`` (on a row found by id) written so the planner cannot read it from an index.

    PostgreSQL plans from statistics: taken while the table held mostly finished jobs, they
    call QUEUED and CLAIMED rare, and ``WHERE id = ANY(...) AND status = 'queued'`` then
    walks every queued entry of a status index (and every dead one) to find a hundred ids
    instead of looking them up by primary key. ``(...) IS TRUE`` is the same test (the
    columns are NOT NULL) that no index answers. MySQL estimates ranges by reading the
    index (no stale statistics) and SQLite prefers the primary key: unchanged there.
    """
    return f"({condition}) IS TRUE" if conn.vendor == "postgresql" else condition


def has_locking_reads(conn: BaseDatabaseWrapper) -> bool:
    """``SELECT ... FOR UPDATE SKIP LOCKED`` exists (not on SQLite, which locks the file)."""
    return conn.vendor != "sqlite"


def has_lateral_arrays(conn: BaseDatabaseWrapper) -> bool:
    """One statement can probe an index once per element of an array parameter
    (``unnest(%s) CROSS JOIN LATERAL``): PostgreSQL. MariaDB has no LATERAL, SQLite
    neither; they read many queues in chunks of UNION ALL instead."""
    return conn.vendor == "postgresql"


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


@contextmanager
def plain_transaction(using: str) -> Iterator[None]:
    """A transaction of the caller's own raw SQL, begun and ended by plain statements.

    ``transaction.atomic()`` on a connection in autocommit switches autocommit off and on
    again around the transaction: on MySQL/MariaDB two more round trips (``SET
    autocommit``) for every claim. This sends ``START TRANSACTION`` and ``COMMIT`` (or
    ``ROLLBACK``) instead, while Django's view of the connection stays "autocommit, no
    atomic block": the block must run raw SQL only, nothing that opens an atomic block
    (the ORM's writes may). Inside an atomic block, or on SQLite (whose claims must BEGIN
    IMMEDIATE), it is :func:`write_transaction`.
    """
    connection = connections[using]
    if connection.vendor == "sqlite" or connection.in_atomic_block:
        with write_transaction(using):
            yield
        return
    connection.ensure_connection()
    if not connection.get_autocommit():
        with transaction.atomic(using=using):
            yield
        return
    with connection.cursor() as cursor:
        cursor.execute("START TRANSACTION" if connection.vendor == "mysql" else "BEGIN")
        try:
            yield
        except BaseException:
            try:
                cursor.execute("ROLLBACK")
            except Exception:  # a broken connection has no transaction left to end
                connection.errors_occurred = True
            raise
        cursor.execute("COMMIT")


def insert_rows(
    conn: BaseDatabaseWrapper,
    table: str,
    columns: str,
    rows: list[list[Any]],
    batch_size: int,
) -> list[int] | None:
    """INSERT ``rows``; return the new ids in order, or None where the database cannot say.

    PostgreSQL: psycopg pipelines ``executemany()`` (one parsed statement, rows streamed);
    a many-row VALUES list would be re-parsed client-side per chunk. Elsewhere: multi-row
    VALUES in chunks, with RETURNING where it exists (MariaDB, SQLite; not MySQL).
    ``table`` and ``columns`` are quoted identifiers; every value goes through the driver.
    """
    qn = conn.ops.quote_name
    placeholder = f"({placeholders(len(rows[0]))})"
    new_ids: list[int] = []
    with conn.cursor() as cursor:
        if conn.vendor == "postgresql":
            sql = f"INSERT INTO {table} ({columns}) VALUES {placeholder} RETURNING {qn('id')}"  # noqa: S608
            raw = cursor.cursor
            raw.executemany(sql, rows, returning=True)
            while True:
                new_ids.append(raw.fetchone()[0])
                if not raw.nextset():
                    break
            return new_ids
        returning = bool(conn.features.can_return_rows_from_bulk_insert)
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
    return new_ids if returning else None


def estimated_rows(using: str, table: str) -> int | None:
    """The database's own estimate of a table's row count, or None if it has none."""
    connection = connections[using]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass", [table]
            )
        elif connection.vendor == "mysql":
            cursor.execute(
                "SELECT table_rows FROM information_schema.tables "
                "WHERE table_schema = DATABASE() AND table_name = %s",
                [table],
            )
        elif connection.vendor == "sqlite":
            # sqlite_stat1 exists once ANALYZE has run; its "stat" starts with the row count.
            cursor.execute(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'sqlite_stat1'"
            )
            if not cursor.fetchone()[0]:
                return None
            cursor.execute("SELECT stat FROM sqlite_stat1 WHERE tbl = %s AND idx IS NULL", [table])
            row = cursor.fetchone()
            if row is None:
                cursor.execute("SELECT stat FROM sqlite_stat1 WHERE tbl = %s LIMIT 1", [table])
                row = cursor.fetchone()
            return int(str(row[0]).split()[0]) if row else None
        else:
            return None
        row = cursor.fetchone()
    # PostgreSQL reports -1 for a table never analyzed or vacuumed.
    if row is None or row[0] is None or int(row[0]) < 0:
        return None
    return int(row[0])


# MySQL/MariaDB: "Deadlock found when trying to get lock" (the transaction was rolled back).
MYSQL_DEADLOCK = 1213


def is_deadlock(exc: BaseException) -> bool:
    """A deadlock the database resolved by rolling this transaction back."""
    code = exc.args[0] if exc.args else None
    if code == MYSQL_DEADLOCK:
        return True
    cause = exc.__cause__
    return getattr(cause, "sqlstate", None) == "40P01"  # PostgreSQL deadlock_detected
