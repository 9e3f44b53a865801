"""SQLite: no locking reads (a write transaction takes the file's write lock at BEGIN),
exact string comparison, ``INDEXED BY`` where the planner must be told."""

from __future__ import annotations

from typing import ClassVar

from django.db.backends.base.base import BaseDatabaseWrapper

from django_dbqueue.queue.dialects.base import Dialect


class SQLite(Dialect):
    vendor: ClassVar[str] = "sqlite"
    locking_reads: ClassVar[bool] = False
    # No SELECT ... FOR UPDATE: the transaction takes the write lock at BEGIN
    # (IMMEDIATE), so two writers queue on the busy timeout instead of both reading and
    # one failing at once ("database is locked") when it upgrades its lock.
    immediate_writes: ClassVar[bool] = True

    def indexed_by(self, conn: BaseDatabaseWrapper, index: str | None) -> str:
        return "" if index is None else f" INDEXED BY {conn.ops.quote_name(index)}"

    def estimated_rows(self, conn: BaseDatabaseWrapper, table: str) -> int | None:
        with conn.cursor() as cursor:
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
