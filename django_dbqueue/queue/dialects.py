"""Every difference between MySQL/MariaDB, PostgreSQL and SQLite that the queue's SQL meets."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from itertools import repeat
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

if TYPE_CHECKING:
    from django.db.models import Field


def placeholders(count: int) -> str:
    """``%s, %s, ...``: the driver fills in the values; only the count is formatted in."""
    return ", ".join(["%s"] * count)


def ids_in(conn: BaseDatabaseWrapper, column: str, ids: list[int]) -> tuple[str, list[Any]]:
    """``column IN (...)`` for a list of ids, as SQL and its parameters.

    PostgreSQL: ``column = ANY(%s)``, the ids one array parameter. psycopg caches the
    parsing of a statement only up to 50 parameters: a claim of 100 ids as 100
    placeholders was parsed again, in Python, at every claim and every finish. And
    ``column BETWEEN`` the least and the greatest id, which changes no result: with
    statistics taken while the table was empty (a queue drained, then vacuumed), the
    planner priced a hundred primary-key probes above a sequential scan of the whole
    table, and every claim and finish of a 20,000-job drain read all 20,000 rows (10.8
    ms against 1.6 ms a statement). A range on the key makes the index path the cheap one.
    """
    if conn.vendor == "postgresql":
        if not ids:
            return f"{column} = ANY(%s::bigint[])", [ids]
        return f"({column} = ANY(%s::bigint[]) AND {column} BETWEEN %s AND %s)", [
            ids,
            min(ids),
            max(ids),
        ]
    return f"{column} IN ({placeholders(len(ids))})", list(ids)


def keys_in(conn: BaseDatabaseWrapper, column: str, keys: list[str]) -> tuple[str, list[Any]]:
    """``column IN (...)`` for a list of strings (concurrency keys), as :func:`ids_in`:
    one array parameter on PostgreSQL, whose parse psycopg caches."""
    if conn.vendor == "postgresql":
        return f"{column} = ANY(%s::varchar[])", [keys]
    return f"{column} IN ({placeholders(len(keys))})", list(keys)


def keyed_rows(
    conn: BaseDatabaseWrapper, table: str, keys: Sequence[str], by_key: str | None = None
) -> tuple[str, str, list[Any]]:
    """The rows of ``table`` (as ``j``) whose ``concurrency_key`` is one of ``keys``:
    (FROM and WHERE clause, the expression that tells which key a row matched, params).

    Each key matches what the database's own equality says, as a lookup of one key
    would. PostgreSQL and SQLite compare strings exactly: ``concurrency_key IN (...)``
    (an array on PostgreSQL), the row's key is the key. MariaDB's default collations
    ignore case and trailing spaces (``"Key"`` and ``"key"`` share a row of
    ``dbqueue_concurrency`` and a limit): a derived table of ``(n, k)``, one row per
    key (its literals take the column's collation), is joined on the key, and ``r.n``,
    the key's 1-based position in ``keys``, tells which. (:func:`key_position` maps
    either back.) ``by_key``: an index on the key that SQLite must read (``INDEXED
    BY``): for the parked jobs of one key it read every queued row along the status.
    """
    column = f"j.{conn.ops.quote_name('concurrency_key')}"
    if conn.vendor != "mysql":
        where, params = keys_in(conn, column, list(keys))
        forced = ""
        if by_key is not None and conn.vendor == "sqlite":
            forced = f" INDEXED BY {conn.ops.quote_name(by_key)}"
        return f"{table} AS j{forced} WHERE {where}", column, params
    rows = " UNION ALL ".join(["SELECT %s AS n, %s AS k", *["SELECT %s, %s"] * (len(keys) - 1)])
    params = []
    for n, key in enumerate(keys, 1):
        params += [n, key]
    return f"({rows}) AS r JOIN {table} j ON {column} = r.k WHERE 1 = 1", "r.n", params


def key_position(keys: Sequence[str]) -> dict[Any, int]:
    """What :func:`keyed_rows`' key expression says of each of ``keys``, to its index."""
    positions: dict[Any, int] = {}
    for index, key in enumerate(keys):
        positions[key] = positions[index + 1] = index
    return positions


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


def locks_along_claim_index(conn: BaseDatabaseWrapper) -> bool:
    """A claim of one queue is one locking read along the claim index (``ORDER BY ...
    LIMIT n FOR UPDATE SKIP LOCKED``) rather than a plain read of candidate ids and a
    locking read of those by primary key: PostgreSQL, where it is the cheaper of the two
    (7.8 against 11.6 ms a claim of 100 jobs) and claimers no longer read the same
    candidates (two workers draining one queue spent a third of their locking reads on
    rows the other had just taken). On MariaDB the locking walk cost more than both reads
    together (7.9 against 5.8 ms), so InnoDB keeps the two steps."""
    return conn.vendor == "postgresql"


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


def insert_one_sql(
    conn: BaseDatabaseWrapper, table: str, columns: str, values: str, unique: bool, notify: bool
) -> str:
    """The one-statement INSERT of one row (``values``: its placeholders).

    PostgreSQL returns the id (``RETURNING``), with ``notify`` also a
    ``pg_notify(%s, %s)`` per inserted row: NOTIFY is transactional, so the wake-up
    needs no statement of its own and goes out on commit. MySQL/MariaDB and SQLite
    report the id as the cursor's ``lastrowid``, which costs nothing more.
    ``unique``: a row that collides on a unique index is skipped, not an error
    (``ON CONFLICT DO NOTHING``: PostgreSQL aborts a transaction on an error, so the
    alternative is a savepoint round trip around every insert). MySQL has no such
    clause short of ``INSERT IGNORE``, which would also swallow other errors; its
    duplicate-key error rolls back only the statement.
    """
    sql = f"INSERT INTO {table} ({columns}) VALUES ({values})"  # noqa: S608
    if unique and conn.vendor in ("postgresql", "sqlite"):
        sql += " ON CONFLICT DO NOTHING"
    if conn.vendor == "postgresql":
        sql += f" RETURNING {conn.ops.quote_name('id')}"
        if notify:
            sql += ", pg_notify(%s, %s)"
    elif notify:
        raise ValueError("pg_notify exists on PostgreSQL only")
    return sql


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
    fields: Sequence[Field[Any, Any]],
    batches: Iterable[Rows],
    done: Done | None = None,
) -> list[int] | None:
    """INSERT each of ``batches`` in one statement (more where a database limit says
    so); returns the new ids in order, or None where the database cannot say (MySQL).

    ``done(start, stop, ids)`` is called for each statement's rows once it has run. On
    MariaDB each statement is sent before the batch after it is taken from ``batches``
    and before ``done`` is called for the statement before it: the caller's work (making
    the next batch, building the jobs of the last) and the database's overlap. Nothing
    else may use the connection meanwhile.

    Values go through the driver as parameters, never into the SQL text. A column whose
    value is the same in every row is bound once per statement:

    - PostgreSQL: ``INSERT ... SELECT ... FROM unnest(%s, %s, ...)``, one array per
      column that varies (server-side binding: the arrays are not rendered into the SQL).
    - MariaDB 10.6+: ``INSERT ... SELECT ... FROM JSON_TABLE(%s, ...)``, the varying columns of
      all rows in one JSON parameter (mysqlclient escapes each parameter in Python: one
      big one instead of one per value), in chunks under ``max_allowed_packet``.
    - SQLite and MySQL: multi-row ``VALUES``, with ``RETURNING`` where it exists.
    """
    qn = conn.ops.quote_name
    names = [qn(f.attname) for f in fields]
    done = done or _nothing
    if has_json_table(conn):
        return _insert_json_tables(conn, table, fields, names, batches, done)
    if conn.vendor != "postgresql":
        return _insert_values(conn, table, names, batches, done)
    new_ids: list[int] = []
    for rows in batches:
        ids = _insert_unnest(conn, table, fields, names, rows)
        done(rows.offset, rows.offset + rows.count, ids)
        new_ids += ids
    return new_ids


# done(start, stop, ids) of insert_rows
Done = Callable[[int, int, "list[int] | None"], None]


def _nothing(start: int, stop: int, ids: list[int] | None) -> None:
    pass


class Rows:
    """Rows to insert: ``columns`` hold each field's values prepared for the database
    (JSON as text), a list of ``count`` values where ``varying`` says so, else the one
    value of every row. ``offset``: the number of the first row, for ``done``."""

    def __init__(
        self, columns: Sequence[Any], varying: Sequence[bool], count: int, offset: int = 0
    ) -> None:
        self.columns, self.varying, self.count, self.offset = columns, varying, count, offset

    def part(self, start: int, stop: int) -> Rows:
        """The rows ``start:stop`` of these."""
        pairs = zip(self.columns, self.varying, strict=True)
        columns = [column[start:stop] if varies else column for column, varies in pairs]
        return Rows(columns, self.varying, stop - start, self.offset + start)

    def varying_values(self) -> list[Any]:
        """The values of the varying columns, one list per column."""
        return [c for c, v in zip(self.columns, self.varying, strict=True) if v]


def _insert_values(
    conn: BaseDatabaseWrapper,
    table: str,
    names: list[str],
    batches: Iterable[Rows],
    done: Done,
) -> list[int] | None:
    # SQLite binds at most 32,766 parameters per statement.
    most = max(1, 30_000 // len(names))
    placeholder = f"({placeholders(len(names))})"
    returning = bool(conn.features.can_return_rows_from_bulk_insert)
    new_ids: list[int] = []
    with conn.cursor() as cursor:
        for batch in batches:
            for start in range(0, batch.count, most):
                rows = batch.part(start, min(start + most, batch.count))
                sources = [
                    c if v else repeat(c, rows.count)
                    for c, v in zip(rows.columns, rows.varying, strict=True)
                ]
                sql = (
                    f"INSERT INTO {table} ({', '.join(names)}) VALUES "  # noqa: S608
                    f"{', '.join([placeholder] * rows.count)}"
                )
                if returning:
                    sql += f" RETURNING {conn.ops.quote_name('id')}"
                params = [value for row in zip(*sources, strict=False) for value in row]
                cursor.execute(sql, params)
                ids = [row[0] for row in cursor.fetchall()] if returning else None
                done(rows.offset, rows.offset + rows.count, ids)
                new_ids += ids or []
    return new_ids if returning else None


def has_json_table(conn: BaseDatabaseWrapper) -> bool:
    """``JSON_TABLE`` as the queue uses it (``INSERT ... SELECT ... FROM JSON_TABLE(...)
    RETURNING``; ``UPDATE JSON_TABLE(...) STRAIGHT_JOIN`` the job table): MariaDB 10.6+
    (MySQL 8 has JSON_TABLE but no RETURNING; MariaDB 10.5 has RETURNING but no
    JSON_TABLE)."""
    return (
        conn.vendor == "mysql"
        and conn.mysql_is_mariadb  # type: ignore[attr-defined]
        and conn.mysql_version >= (10, 6)  # type: ignore[attr-defined]
    )


def _insert_unnest(
    conn: BaseDatabaseWrapper,
    table: str,
    fields: Sequence[Field[Any, Any]],
    names: list[str],
    chunk: Rows,
) -> list[int]:
    import psycopg
    from django.db.models import JSONField

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


# MariaDB's JSON_TABLE column type for each kind of field (JSON arrives as its text).
_JSON_TABLE_TYPES = {"JSONField": "LONGTEXT", "TextField": "LONGTEXT"}


def _json_table_statements(
    conn: BaseDatabaseWrapper,
    table: str,
    fields: Sequence[Field[Any, Any]],
    names: list[str],
    chunk: Rows,
) -> list[tuple[Rows, str, list[Any]]]:
    """(rows, INSERT, its parameters) for ``chunk``: one statement, or more where its
    JSON document would pass half of ``max_allowed_packet``."""
    values = chunk.varying_values()
    if values:
        document = json.dumps(list(zip(*values, strict=True)))
    else:
        document = "[" + ",".join(["0"] * chunk.count) + "]"
    if len(document) > _max_packet(conn) // 2 and chunk.count > 1:
        middle = chunk.count // 2
        first, second = chunk.part(0, middle), chunk.part(middle, chunk.count)
        return _json_table_statements(conn, table, fields, names, first) + (
            _json_table_statements(conn, table, fields, names, second)
        )
    select: list[str] = []
    params: list[Any] = []
    json_columns: list[str] = []
    for index, (field, column, varies) in enumerate(
        zip(fields, chunk.columns, chunk.varying, strict=True)
    ):
        if varies:
            kind = _JSON_TABLE_TYPES.get(field.get_internal_type()) or field.db_type(conn)
            path = f"$[{len(json_columns)}]"
            json_columns.append(f"c{index} {kind} PATH '{path}' ERROR ON ERROR")
            select.append(f"jt.c{index}")
        else:
            select.append("%s")
            params.append(column)
    if not json_columns:
        json_columns.append("n FOR ORDINALITY")
    source = f"JSON_TABLE(%s, '$[*]' COLUMNS ({', '.join(json_columns)})) AS jt"
    params.append(document)
    sql = (
        f"INSERT INTO {table} ({', '.join(names)}) "  # noqa: S608
        f"SELECT {', '.join(select)} FROM {source} RETURNING {conn.ops.quote_name('id')}"
    )
    return [(chunk, sql, params)]


def _insert_json_tables(
    conn: BaseDatabaseWrapper,
    table: str,
    fields: Sequence[Field[Any, Any]],
    names: list[str],
    batches: Iterable[Rows],
    done: Done,
) -> list[int]:
    """The JSON_TABLE INSERTs, pipelined (see :func:`insert_rows`): mysqlclient's
    ``send_query`` returns at once and ``read_query_result`` waits. A statement sent is
    always read before the next is sent or an error is raised (the caller's included):
    the connection is never left in the middle of a statement."""
    conn.ensure_connection()
    raw: Any = conn.connection
    new_ids: list[int] = []
    finished: tuple[Rows, list[int]] | None = None
    waiting = iter(batches)
    batch = next(waiting, None)
    with raw.cursor() as cursor:  # mysqlclient's own, to bind the parameters
        while batch is not None:
            statements = _json_table_statements(conn, table, fields, names, batch)
            for number, (rows, sql, params) in enumerate(statements, 1):
                query = cursor.mogrify(sql, params).encode(raw.encoding)
                with conn.wrap_database_errors:
                    raw.send_query(query)
                try:  # while the database runs it
                    if finished is not None:
                        _report(done, *finished)
                        finished = None
                    if number == len(statements):
                        batch = next(waiting, None)
                finally:
                    with conn.wrap_database_errors:
                        raw.read_query_result()
                        result = raw.store_result()
                ids = [row[0] for row in result.fetch_row(0)]
                if len(ids) != rows.count:
                    raise RuntimeError(f"inserted {len(ids)} jobs of {rows.count}")
                finished = (rows, ids)
                new_ids += ids
    if finished is not None:
        _report(done, *finished)
    return new_ids


def _report(done: Done, rows: Rows, ids: list[int]) -> None:
    done(rows.offset, rows.offset + rows.count, ids)


def _max_packet(conn: BaseDatabaseWrapper) -> int:
    size: int | None = getattr(conn, "_dbqueue_max_packet", None)
    if size is None:
        with conn.cursor() as cursor:
            cursor.execute("SELECT @@max_allowed_packet")
            size = int(cursor.fetchone()[0])
        conn._dbqueue_max_packet = size  # type: ignore[attr-defined]
    return size


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
# MySQL/MariaDB: "Lock wait timeout exceeded" (only the statement was rolled back).
MYSQL_LOCK_WAIT_TIMEOUT = 1205


def is_deadlock(exc: BaseException) -> bool:
    """A deadlock the database resolved by rolling this transaction back."""
    code = exc.args[0] if exc.args else None
    if code == MYSQL_DEADLOCK:
        return True
    cause = exc.__cause__
    return getattr(cause, "sqlstate", None) == "40P01"  # PostgreSQL deadlock_detected


def is_lock_conflict(exc: BaseException) -> bool:
    """A deadlock, or a lock wait that timed out: another writer was in the way, and the
    same statement may well pass when tried again."""
    if is_deadlock(exc):
        return True
    code = exc.args[0] if exc.args else None
    if code == MYSQL_LOCK_WAIT_TIMEOUT:
        return True
    cause = exc.__cause__
    return getattr(cause, "sqlstate", None) == "55P03"  # PostgreSQL lock_not_available
