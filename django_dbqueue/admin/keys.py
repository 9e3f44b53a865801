"""The admin's list of concurrency keys: per key, its limit, the jobs holding its slots
and the jobs waiting for one (docs/concurrency.md).

Read-only, and seen by whoever may view jobs: a key row is how the queue's jobs are doing,
not a thing to edit. The counts are per-row subqueries over the index on
``(concurrency_key, id)``: one page of keys costs a few index ranges per key.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from django.contrib import admin
from django.db.models import Count, IntegerField, Max, OuterRef, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from django_dbqueue.models import ConcurrencyKey, Job
from django_dbqueue.queue.concurrency import PARKED_UNTIL
from django_dbqueue.status import CLAIMED, QUEUED

if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[ConcurrencyKey]
else:  # ModelAdmin is generic only in the type stubs
    _ModelAdmin = admin.ModelAdmin


def _per_key(jobs: QuerySet[Job], aggregate: Any) -> Coalesce:
    one_key = jobs.filter(concurrency_key=OuterRef("key")).order_by()
    value = one_key.values("concurrency_key").annotate(v=aggregate).values("v")
    return Coalesce(Subquery(value, output_field=IntegerField()), Value(0))


class ForJobViewers:
    """Read-only pages about the queue's jobs (keys, batches): whoever may view jobs may
    view them; nobody adds, changes or deletes them."""

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        user: Any = request.user
        return bool(user.is_active and user.is_staff) and (
            user.has_perm("django_dbqueue.view_job") or user.has_perm("django_dbqueue.change_job")
        )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(ConcurrencyKey)
class ConcurrencyKeyAdmin(ForJobViewers, _ModelAdmin):
    list_display = ("key_link", "limit", "running", "waiting", "parked_jobs")
    list_display_links = None  # no change page to link to: the key links to its jobs
    search_fields = ("key",)
    ordering = ("key",)
    list_per_page = 100
    show_full_result_count = False
    fields = ("key",)
    readonly_fields = ("key",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[ConcurrencyKey]:
        active = Job.objects.filter(status__in=[QUEUED, CLAIMED])
        return (
            super()
            .get_queryset(request)
            .annotate(
                limit_now=_per_key(active, Max("concurrency_limit")),
                running_now=_per_key(Job.objects.filter(status=CLAIMED), Count("pk")),
                waiting_now=_per_key(Job.objects.filter(status=QUEUED), Count("pk")),
                parked_now=_per_key(
                    Job.objects.filter(status=QUEUED, run_after=PARKED_UNTIL), Count("pk")
                ),
            )
        )

    @admin.display(description="key", ordering="key")
    def key_link(self, key: ConcurrencyKey) -> SafeString:
        url = reverse("admin:django_dbqueue_job_changelist")
        query = urlencode({"concurrency_key": key.key})
        return format_html('<a href="{}?{}">{}</a>', url, query, key.key)

    @admin.display(description="limit")
    def limit(self, key: Any) -> str:
        # Jobs of one key may carry different limits; the largest of its active jobs.
        return str(key.limit_now) if key.limit_now else "-"

    @admin.display(description="holding a slot")
    def running(self, key: Any) -> int:
        return int(key.running_now)

    @admin.display(description="waiting (queued)")
    def waiting(self, key: Any) -> int:
        return int(key.waiting_now)

    @admin.display(description="of which parked over the limit")
    def parked_jobs(self, key: Any) -> int:
        return int(key.parked_now)
