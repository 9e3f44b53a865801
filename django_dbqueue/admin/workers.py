"""The admin's list of worker processes: supervisors, their children and what each runs.

Read-only: each row mirrors a live process (or a dead one, until its row expires).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.contrib import admin
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from django_dbqueue.admin import dashboard
from django_dbqueue.models import WorkerProcess
from django_dbqueue.queue import clock

if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[WorkerProcess]
else:  # ModelAdmin is generic only in the type stubs
    _ModelAdmin = admin.ModelAdmin


@admin.register(WorkerProcess)
class WorkerAdmin(_ModelAdmin):
    list_display = (
        "name",
        "role",
        "host",
        "pid",
        "supervisor",
        "running_job",
        "running_since",
        "queues",
        "heartbeat_at",
        "clock_offset",
        "alive",
        "jobs_done",
        "jobs_failed",
        "stopping",
    )
    list_filter = ("role", "host")
    ordering = ("host", "pid")
    readonly_fields = (
        "name",
        "role",
        "host",
        "pid",
        "supervisor",
        "running_job",
        "running_since",
        "queues",
        "started_at",
        "heartbeat_at",
        "clock_offset",
        "jobs_done",
        "jobs_failed",
        "stopping",
    )
    fields = readonly_fields

    @admin.display(boolean=True, description="alive")
    def alive(self, worker: WorkerProcess) -> bool:
        return dashboard.is_alive(worker, clock.queue_now())

    @admin.display(description="running job", ordering="running_job_id")
    def running_job(self, worker: WorkerProcess) -> str:
        if worker.running_job_id is None:
            return "-"
        url = reverse("admin:django_dbqueue_job_change", args=[worker.running_job_id])
        return format_html('<a href="{}">#{}</a>', url, worker.running_job_id)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # workers register themselves

    def has_change_permission(self, request: HttpRequest, obj: WorkerProcess | None = None) -> bool:
        return False  # the row mirrors a process; editing it changes nothing real
