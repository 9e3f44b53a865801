"""The admin's batches page (docs/workflows.md): each batch's members, how many have
ended (done, failed, cancelled, from its counter shards), whether it is closed and
complete, and the callbacks it enqueued.

Read-only and seen by whoever may view jobs: a batch changes only through its members.
A page of batches costs one aggregate of counter shards per batch (16 rows each).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.db.models import IntegerField, OuterRef, QuerySet, Subquery, Sum, Value
from django.db.models.functions import Coalesce
from django.http import HttpRequest

from django_dbqueue.admin.keys import ForJobViewers
from django_dbqueue.models import Batch, BatchCounter

if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[Batch]
else:  # ModelAdmin is generic only in the type stubs
    _ModelAdmin = admin.ModelAdmin

COUNTS = ("done", "failed", "cancelled")


def _counted(name: str) -> Coalesce:
    shards = BatchCounter.objects.filter(batch_id=OuterRef("pk")).order_by()
    total = shards.values("batch_id").annotate(v=Sum(name)).values("v")
    return Coalesce(Subquery(total, output_field=IntegerField()), Value(0))


@admin.register(Batch)
class BatchAdmin(ForJobViewers, _ModelAdmin):
    list_display = (
        "id",
        "progress",
        "total",
        "ended_done",
        "ended_failed",
        "ended_cancelled",
        "closed",
        "created_at",
        "completed_at",
    )
    list_filter = ("closed",)
    ordering = ("-id",)
    list_per_page = 100
    show_full_result_count = False
    fields = ("total", "closed", "created_at", "completed_at", "callbacks", "callback_ids")
    readonly_fields = fields

    def get_queryset(self, request: HttpRequest) -> QuerySet[Batch]:
        counted = {f"{name}_now": _counted(name) for name in COUNTS}
        return super().get_queryset(request).annotate(**counted)

    @admin.display(description="progress")
    def progress(self, batch: Any) -> str:
        ended = sum(int(getattr(batch, f"{name}_now", 0)) for name in COUNTS)
        if not batch.total:
            return "empty"
        return f"{ended} of {batch.total} ({100 * ended // batch.total}%)"

    @admin.display(description="done")
    def ended_done(self, batch: Any) -> int:
        return int(batch.done_now)

    @admin.display(description="failed")
    def ended_failed(self, batch: Any) -> int:
        return int(batch.failed_now)

    @admin.display(description="cancelled")
    def ended_cancelled(self, batch: Any) -> int:
        return int(batch.cancelled_now)
