"""A paginator for tables with millions of rows: no unbounded ``COUNT(*)``.

Counting a big InnoDB or PostgreSQL table reads every row (neither keeps an exact row
count), which makes every changelist page slow. This paginator counts at most
``limit + 1`` matching rows (``COUNT(*)`` over a ``LIMIT`` subquery) and, for the
unfiltered table, takes the planner's row estimate instead once the table is bigger
than that.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, cast

from django.core.paginator import Paginator
from django.db import connections
from django.db.models import QuerySet


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


class CappedCountPaginator(Paginator[Any]):
    """Counts exactly up to ``limit`` rows; beyond that the count is a lower bound or
    an estimate, and :attr:`exact` is False."""

    limit = 10_000

    def __init__(self, object_list: QuerySet[Any], per_page: int, *args: Any, **kwargs: Any):
        self.limit = int(kwargs.pop("limit", self.limit))
        super().__init__(object_list, per_page, *args, **kwargs)
        self.exact = True
        self.estimated = False

    @cached_property
    def count(self) -> int:
        queryset = cast(QuerySet[Any], self.object_list)
        if not queryset.query.where:
            estimate = estimated_rows(queryset.db, queryset.model._meta.db_table)
            if estimate is not None and estimate > self.limit:
                self.exact, self.estimated = False, True
                return estimate
        counted = queryset.order_by()[: self.limit + 1].count()
        if counted > self.limit:
            self.exact = False
            return self.limit
        return counted

    @property
    def count_label(self) -> str:
        """The count as operators should read it: exact, "about" or "more than"."""
        count = self.count
        if self.exact:
            return f"{count:,}"
        if self.estimated:
            return f"about {count:,}"
        return f"more than {count:,}"
