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
from django_dbqueue.admin.pages import time_column
from django_dbqueue.models import WorkerProcess
from django_dbqueue.queue import clock

if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[WorkerProcess]
else:  # ModelAdmin is generic only in the type stubs
    _ModelAdmin = admin.ModelAdmin


@admin.register(WorkerProcess)
class WorkerAdmin(_ModelAdmin):
    # These fit a 1280 px window beside the admin's sidebar and the filters: host and pid
    # are in the name; the supervisor and the start are on the row's own page.
    list_display = (
        "name",
        "role",
        "queue_names",
        "running_job",
        "heartbeat_at_short",
        "alive",
        "done",
        "failed",
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
        "running_since_time",
        "queues",
        "started_at_time",
        "heartbeat_at_time",
        "clock_offset",
        "jobs_done",
        "jobs_failed",
        "stopping",
    )
    fields = readonly_fields

    running_since_time = time_column("running_since")
    started_at_time = time_column("started_at")
    heartbeat_at_time = time_column("heartbeat_at")
    heartbeat_at_short = time_column("heartbeat_at", short=True)  # the list's

    @admin.display(boolean=True, description="alive")
    def alive(self, worker: WorkerProcess) -> bool:
        return dashboard.is_alive(worker, clock.queue_now())

    @admin.display(description="done", ordering="jobs_done")
    def done(self, worker: WorkerProcess) -> int:
        return worker.jobs_done

    @admin.display(description="failed", ordering="jobs_failed")
    def failed(self, worker: WorkerProcess) -> int:
        return worker.jobs_failed

    @admin.display(description="queues")
    def queue_names(self, worker: WorkerProcess) -> str:
        return ", ".join(worker.queues or [])

    @admin.display(description="running job", ordering="running_job_id")
    def running_job(self, worker: WorkerProcess) -> str:
        if worker.running_job_id is None:
            return "stopping" if worker.stopping else "-"
        url = reverse("admin:django_dbqueue_job_change", args=[worker.running_job_id])
        link = format_html('<a href="{}">#{}</a>', url, worker.running_job_id)
        if worker.running_since is None:
            return link
        running = dashboard.humanize(clock.queue_now() - worker.running_since)
        stopping = ", stopping" if worker.stopping else ""
        return format_html("{} for {}{}", link, running, stopping)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # workers register themselves

    def has_change_permission(self, request: HttpRequest, obj: WorkerProcess | None = None) -> bool:
        return False  # the row mirrors a process; editing it changes nothing real
