"""The queue's short transactions: a write transaction suited to the database, and a
transaction of raw SQL begun and ended by plain statements."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connections, transaction

from django_dbqueue.queue.dialects.choice import dialect


@contextmanager
def write_transaction(using: str) -> Iterator[None]:
    """A short read-then-write transaction suited to this database.

    Where there are no locking reads (SQLite) the transaction takes the write lock at
    BEGIN (IMMEDIATE), so two writers queue on the busy timeout instead of both
    reading and one failing at once ("database is locked") when it upgrades its lock.
    """
    connection = connections[using]
    if not dialect(connection).immediate_writes or connection.in_atomic_block:
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
    autocommit``) for every claim. This sends ``START TRANSACTION`` (``BEGIN``) and
    ``COMMIT`` (or ``ROLLBACK``) instead, while Django's view of the connection stays
    "autocommit, no atomic block": the block must run raw SQL only, nothing that opens an
    atomic block (the ORM's writes may). Inside an atomic block, or where writes must
    BEGIN IMMEDIATE (SQLite's claims), it is :func:`write_transaction`.
    """
    connection = connections[using]
    speaks = dialect(connection)
    if speaks.immediate_writes or connection.in_atomic_block:
        with write_transaction(using):
            yield
        return
    connection.ensure_connection()
    if not connection.get_autocommit():
        with transaction.atomic(using=using):
            yield
        return
    with connection.cursor() as cursor:
        cursor.execute(speaks.begin)
        try:
            yield
        except BaseException:
            try:
                cursor.execute("ROLLBACK")
            except Exception:  # a broken connection has no transaction left to end
                connection.errors_occurred = True
            raise
        cursor.execute("COMMIT")
