"""The admin's list of worker processes (read-only: each row mirrors a live process)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.contrib import admin
from django.http import HttpRequest
from django.utils import timezone

from django_dbqueue.admin import dashboard
from django_dbqueue.models import WorkerProcess

if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[WorkerProcess]
else:  # ModelAdmin is generic only in the type stubs
    _ModelAdmin = admin.ModelAdmin


@admin.register(WorkerProcess)
class WorkerAdmin(_ModelAdmin):
    list_display = (
        "name",
        "host",
        "pid",
        "queues",
        "heartbeat_at",
        "alive",
        "jobs_done",
        "jobs_failed",
        "stopping",
    )
    ordering = ("host", "pid")
    readonly_fields = (
        "name",
        "host",
        "pid",
        "queues",
        "started_at",
        "heartbeat_at",
        "jobs_done",
        "jobs_failed",
        "stopping",
    )

    @admin.display(boolean=True, description="alive")
    def alive(self, worker: WorkerProcess) -> bool:
        return dashboard.is_alive(worker, timezone.now())

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # workers register themselves

    def has_change_permission(self, request: HttpRequest, obj: WorkerProcess | None = None) -> bool:
        return False  # the row mirrors a process; editing it changes nothing real
