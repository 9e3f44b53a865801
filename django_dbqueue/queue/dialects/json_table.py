"""MariaDB 10.6+'s multi-row INSERT: ``INSERT ... SELECT ... FROM JSON_TABLE(%s, ...)
RETURNING``, the varying columns of all rows in one JSON parameter (mysqlclient escapes
each parameter in Python: one big one instead of one per value), in chunks under
``max_allowed_packet``, each statement sent while the caller makes the next batch."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from django.db.backends.base.base import BaseDatabaseWrapper

from django_dbqueue.queue.dialects.rows import Done, Rows

if TYPE_CHECKING:
    from django.db.models import Field

# MariaDB's JSON_TABLE column type for each kind of field (JSON arrives as its text).
_JSON_TABLE_TYPES = {"JSONField": "LONGTEXT", "TextField": "LONGTEXT"}


def json_table_statements(
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
        return json_table_statements(conn, table, fields, names, first) + (
            json_table_statements(conn, table, fields, names, second)
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


def insert_json_tables(
    conn: BaseDatabaseWrapper,
    table: str,
    fields: Sequence[Field[Any, Any]],
    names: list[str],
    batches: Iterable[Rows],
    done: Done,
) -> list[int]:
    """The JSON_TABLE INSERTs, pipelined: each statement is sent before the batch after
    it is taken from ``batches`` and before ``done`` is called for the statement before
    it (mysqlclient's ``send_query`` returns at once and ``read_query_result`` waits). A
    statement sent is always read before the next is sent or an error is raised (the
    caller's included): the connection is never left in the middle of a statement."""
    conn.ensure_connection()
    raw: Any = conn.connection
    new_ids: list[int] = []
    finished: tuple[Rows, list[int]] | None = None
    waiting = iter(batches)
    batch = next(waiting, None)
    with raw.cursor() as cursor:  # mysqlclient's own, to bind the parameters
        while batch is not None:
            statements = json_table_statements(conn, table, fields, names, batch)
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
