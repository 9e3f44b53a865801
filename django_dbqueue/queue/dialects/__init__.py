"""Every difference between MySQL/MariaDB, PostgreSQL and SQLite that the queue's SQL meets.

One :class:`Dialect` object per database, chosen once per connection by
:func:`dialect`; the queue's modules call its named methods and flags and never test
``connection.vendor`` themselves. One module per concern:

- ``base.py``: the interface, written in portable SQL (and :func:`key_position`);
- ``sqlite.py``, ``mysql.py``, ``postgresql.py``: what each database does differently;
- ``choice.py``: which dialect a connection speaks;
- ``rows.py``: the rows of a multi-row INSERT and the portable ``VALUES`` statement;
  ``json_table.py``: MariaDB's pipelined ``JSON_TABLE`` one (PostgreSQL's ``unnest``
  one is in ``postgresql.py``);
- ``transactions.py``: the queue's short transactions; ``errors.py``: deadlocks.

The functions below keep the names the rest of the package imports.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from django_dbqueue.queue.dialects.base import Dialect, DoneRows, key_position
from django_dbqueue.queue.dialects.choice import dialect
from django_dbqueue.queue.dialects.errors import MYSQL_DEADLOCK, is_deadlock, is_lock_conflict
from django_dbqueue.queue.dialects.rows import Done, Rows, nothing, placeholders
from django_dbqueue.queue.dialects.transactions import plain_transaction, write_transaction

if TYPE_CHECKING:
    from django.db.models import Field

__all__ = [
    "MYSQL_DEADLOCK",
    "Dialect",
    "Done",
    "DoneRows",
    "Rows",
    "by_id_only",
    "dialect",
    "estimated_rows",
    "has_json_table",
    "ids_in",
    "insert_rows",
    "is_deadlock",
    "is_lock_conflict",
    "key_position",
    "placeholders",
    "plain_transaction",
    "server_address",
    "write_transaction",
]


def ids_in(conn: BaseDatabaseWrapper, column: str, ids: list[int]) -> tuple[str, list[Any]]:
    """``column IN (...)`` for a list of ids, as SQL and its parameters
    (:meth:`Dialect.ids_in`: one array parameter on PostgreSQL)."""
    return dialect(conn).ids_in(conn, column, ids)


def by_id_only(conn: BaseDatabaseWrapper, condition: str) -> str:
    """``condition`` (on a row found by id) so that no index answers it
    (:meth:`Dialect.by_id_only`)."""
    return dialect(conn).by_id_only(condition)


def has_json_table(conn: BaseDatabaseWrapper) -> bool:
    """``JSON_TABLE`` as the queue uses it: MariaDB 10.6+ (:meth:`.mysql.MySQL.uses_json_table`)."""
    return dialect(conn).uses_json_table(conn)


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
    - MariaDB 10.6+: ``INSERT ... SELECT ... FROM JSON_TABLE(%s, ...)``, the varying
      columns of all rows in one JSON parameter, in chunks under ``max_allowed_packet``.
    - SQLite and MySQL: multi-row ``VALUES``, with ``RETURNING`` where it exists.
    """
    names = [conn.ops.quote_name(f.attname) for f in fields]
    return dialect(conn).insert_rows(conn, table, fields, names, batches, done or nothing)


def estimated_rows(using: str, table: str) -> int | None:
    """The database's own estimate of a table's row count, or None if it has none."""
    conn = connections[using]
    return dialect(conn).estimated_rows(conn, table)


DEFAULT_PORTS = {"mysql": "3306", "postgresql": "5432"}


def server_address(conn: BaseDatabaseWrapper) -> str:
    """host:port of a connection's server (the file, for SQLite): what run_jobs names
    while the database is unreachable."""
    params = conn.settings_dict
    if conn.vendor == "sqlite":
        return str(params.get("NAME"))
    port = params.get("PORT") or DEFAULT_PORTS.get(conn.vendor, "")
    return f"{params.get('HOST') or 'localhost'}:{port}"
