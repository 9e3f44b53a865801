"""List filters for the job admin that stay cheap on tables with millions of rows.

Django's default filter for a plain field lists its values with SELECT DISTINCT, a scan
of the whole table; these take their choices from settings or from the newest rows.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from django_dbqueue.conf import settings
from django_dbqueue.models import Job
from django_dbqueue.queue import clock
from django_dbqueue.queue.actions import finished_with

BIGINT_MAX = 2**63 - 1  # the largest value of a BigAutoField, on every database


def parse_job_id(text: str) -> int | None:
    """The job id ``text`` spells in ASCII digits, or None.

    Not ``str.isdigit()``: it accepts "²" and other digits that int() refuses, and a
    5,000-digit number passes it but not int() nor the database's bigint.
    """
    if not text or len(text) > 19 or not text.isascii() or not text.isdigit():
        return None
    number = int(text)
    return number if number <= BIGINT_MAX else None


class QueueFilter(admin.SimpleListFilter):
    """Queues from settings: the field's default filter would run SELECT DISTINCT."""

    title = "queue"
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        queues = list(settings.QUEUES)
        value = self.value()
        if value and value not in queues:
            queues.append(value)  # a queue removed from settings still has rows
        return [(queue, queue) for queue in queues]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        value = self.value()
        return queryset.filter(queue=value) if value else queryset


class TaskFilter(admin.SimpleListFilter):
    """Tasks seen among the newest jobs: a DISTINCT over millions of rows is too slow.

    Any task path is accepted in the URL (``?task=myapp.tasks.send_mail``), listed or not.
    """

    title = "task"
    parameter_name = "task"
    recent = 5000

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        recent = Job.objects.order_by("-id").values_list("task", flat=True)[: self.recent]
        tasks = set(recent)
        value = self.value()
        if value:
            tasks.add(value)
        return [(task, task) for task in sorted(tasks)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        value = self.value()
        return queryset.filter(task=value) if value else queryset


class FailedSinceFilter(admin.SimpleListFilter):
    title = "failed since"
    parameter_name = "failed_since"
    periods = {"1h": timedelta(hours=1), "24h": timedelta(days=1), "7d": timedelta(days=7)}

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("1h", "Last hour"), ("24h", "Last 24 hours"), ("7d", "Last 7 days")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        value = self.value()
        if not value:
            return queryset
        period = self.periods.get(value)
        if period is None:
            # An unknown period matches nothing: ignoring it would widen the selection,
            # and "select all" + delete would then delete every job.
            return queryset.none()
        since = clock.queue_now() - period
        return finished_with(queryset, Job.Status.FAILED).filter(finished_at__gte=since)
