"""The admin's scheduling pages: recurring schedules (last and next tick, enqueue now),
pausing and resuming queues, and how big the job table has grown."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db import router, transaction
from django.db.models import Max
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.views.decorators.http import require_POST

from django_dbqueue.admin.pages import page_context
from django_dbqueue.conf import settings
from django_dbqueue.enqueueing import enqueue
from django_dbqueue.exceptions import InvalidJob, ScheduleError
from django_dbqueue.models import Job, ScheduleTick
from django_dbqueue.queue import clock, pausing
from django_dbqueue.queue.dialects import estimated_rows
from django_dbqueue.scheduling.recurring import Schedule
from django_dbqueue.scheduling.sources import all_schedules
from django_dbqueue.status import FINISHED

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

    _Base = ModelAdmin[Job]
else:
    _Base = object

logger = logging.getLogger("django_dbqueue.admin")


@dataclass
class ScheduleRow:
    schedule: Schedule
    last_tick: datetime | None
    next_tick: datetime | None
    last_job_id: int | None
    last_job_status: str

    @property
    def when(self) -> str:
        if self.schedule.cron is not None:
            return f"cron {self.schedule.cron} ({self.schedule.timezone.key})"
        seconds = int(self.schedule.every.total_seconds()) if self.schedule.every else 0
        return f"every {seconds} s"


def schedule_rows(now: datetime) -> list[ScheduleRow]:
    """Each schedule with its newest tick, its next tick and its newest job's status."""
    schedules = all_schedules()
    using = router.db_for_read(ScheduleTick)
    ticks = ScheduleTick.objects.using(using)
    newest = dict(
        ticks.filter(schedule__in=[s.name for s in schedules])
        .values("schedule")
        .annotate(last=Max("tick_at"))
        .values_list("schedule", "last")
    )
    rows = []
    for schedule in schedules:
        last = newest.get(schedule.name)
        job_id = None
        if last is not None:
            job_id = (
                ticks.filter(schedule=schedule.name, tick_at=last)
                .values_list("job_id", flat=True)
                .first()
            )
        rows.append(ScheduleRow(schedule, last, schedule.next_tick(now), job_id, ""))
    statuses = dict(
        Job.objects.filter(pk__in=[r.last_job_id for r in rows if r.last_job_id]).values_list(
            "id", "status"
        )
    )
    for row in rows:
        if row.last_job_id is not None:
            row.last_job_status = statuses.get(row.last_job_id, "deleted")
    return rows


def enqueue_schedule_now(name: str) -> Job:
    """Enqueue a schedule's job at once, recorded as its newest tick (the next regular
    tick still comes at its time)."""
    schedule = next((s for s in all_schedules() if s.name == name), None)
    if schedule is None:
        raise Http404(f"No schedule named {name[:100]!r}.")
    using = router.db_for_write(ScheduleTick)
    with transaction.atomic(using=using):
        job = enqueue(
            schedule.task, list(schedule.args), dict(schedule.kwargs), **schedule.enqueue_options()
        )
        ScheduleTick.objects.using(using).create(
            schedule=name, tick_at=clock.now(using), job_id=job.pk
        )
    return job


@dataclass
class TableSize:
    rows: int | None  # the database's estimate; None where it keeps none
    oldest_finished: datetime | None


def table_size() -> TableSize:
    """The job table's size and its oldest finished row: what retention is for."""
    using = router.db_for_read(Job)
    oldest = [
        when
        for status in FINISHED
        if (
            when := Job.objects.using(using)
            .finished_with(status)
            .order_by("finished_at")
            .values_list("finished_at", flat=True)
            .first()
        )
        is not None
    ]
    return TableSize(estimated_rows(using, Job._meta.db_table), min(oldest, default=None))


def dashboard_context() -> dict[str, Any]:
    return {"paused": pausing.paused_queues(), "table": table_size()}


class SchedulingAdmin(_Base):
    """Views and actions the job admin gets for schedules and queues."""

    def scheduling_urls(self) -> list[URLPattern]:
        info = self.opts.app_label, self.opts.model_name
        return [
            path(
                "schedules/",
                self.admin_site.admin_view(self.schedules_view),
                name="{}_{}_schedules".format(*info),
            ),
            path(
                "schedules/enqueue/",
                self.admin_site.admin_view(require_POST(self.schedule_enqueue_view)),
                name="{}_{}_schedule_enqueue".format(*info),
            ),
            path(
                "queues/switch/",
                self.admin_site.admin_view(require_POST(self.queue_switch_view)),
                name="{}_{}_queue_switch".format(*info),
            ),
        ]

    def _url(self, name: str) -> str:
        return reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_{name}")

    def schedules_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied("Viewing jobs is required to see the schedules.")
        error, rows = "", []
        try:
            rows = schedule_rows(clock.queue_now())
        except ScheduleError as exc:
            error = str(exc)
        context = {
            **page_context(self, request, "Recurring schedules", ("dashboard", "Dashboard")),
            "rows": rows,
            "error": error,
            "can_change": self.has_change_permission(request),
        }
        return TemplateResponse(request, "admin/django_dbqueue/schedules.html", context)

    def schedule_enqueue_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_change_permission(request):
            raise PermissionDenied("Changing jobs is required to enqueue a schedule's job.")
        name = request.POST.get("schedule", "")
        try:
            job = enqueue_schedule_now(name)
        except (InvalidJob, ScheduleError) as exc:
            self.message_user(request, f"Schedule {name!r} not enqueued: {exc}", messages.ERROR)
        else:
            self.message_user(request, f"Schedule {name!r}: job #{job.pk} enqueued.")
        return HttpResponseRedirect(self._url("schedules"))

    def queue_switch_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_change_permission(request):
            raise PermissionDenied("Changing jobs is required to pause or resume a queue.")
        queue, operation = request.POST.get("queue", ""), request.POST.get("operation", "")
        if operation not in ("pause", "resume") or queue not in settings.QUEUES:
            raise Http404("Unknown queue or operation.")
        by = f"admin: {request.user.get_username()}"
        changed = pausing.pause(queue, by) if operation == "pause" else pausing.resume(queue, by)
        state = "paused" if operation == "pause" else "running"
        self.message_user(
            request, f"Queue {queue!r} {'is now' if changed else 'was already'} {state}."
        )
        return HttpResponseRedirect(self._url("dashboard"))

    def _switch_selected(self, request: HttpRequest, queryset: Any, pause: bool) -> None:
        queues = sorted(
            q
            for q in queryset.order_by().values_list("queue", flat=True).distinct()[:1000]
            if q in settings.QUEUES
        )
        by = f"admin: {request.user.get_username()}"
        for queue in queues:
            pausing.pause(queue, by) if pause else pausing.resume(queue, by)
        verb = "Paused" if pause else "Resumed"
        self.message_user(request, f"{verb} queue(s): {', '.join(queues) or 'none'}.")
