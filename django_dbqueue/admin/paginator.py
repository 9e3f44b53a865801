"""A paginator for tables with millions of rows: no unbounded ``COUNT(*)``.

Counting a big InnoDB or PostgreSQL table reads every row (neither keeps an exact row
count), which makes every changelist page slow. This paginator counts at most
``limit + 1`` matching rows (``COUNT(*)`` over a ``LIMIT`` subquery) and, for the
unfiltered table, takes the planner's row estimate instead once the table is bigger
than that.
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Any

from django.core.paginator import Paginator
from django.db.models import QuerySet

from django_dbqueue.queue.dialects import estimated_rows

if TYPE_CHECKING:
    _Paginator = Paginator[Any]
else:  # Paginator is generic only in the type stubs
    _Paginator = Paginator


class CappedCountPaginator(_Paginator):
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
        queryset: QuerySet[Any] = self.object_list  # type: ignore[assignment]
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
