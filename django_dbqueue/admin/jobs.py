"""The job pages of the admin: job list, job detail, actions and the dashboard view.

Actions call the library (:class:`django_dbqueue.queue.actions.JobQuerySet`); large selections
("all N matching the filter") are worked through in chunks of primary keys so no single
statement locks a big range of the table the workers claim from.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.utils import flatten_fieldsets
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.safestring import SafeString
from django.views.decorators.http import require_POST

from django_dbqueue.admin import dashboard
from django_dbqueue.admin.bulk import apply_in_chunks
from django_dbqueue.admin.filters import (
    FailedSinceFilter,
    QueueFilter,
    TaskFilter,
    parse_job_id,
)
from django_dbqueue.admin.lookups import refuse_crafted_lookups
from django_dbqueue.admin.paginator import CappedCountPaginator
from django_dbqueue.admin.scheduling import SchedulingAdmin, dashboard_context
from django_dbqueue.conf import settings
from django_dbqueue.models import Job
from django_dbqueue.queue.actions import JobQuerySet, RequeueReport

if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[Job]
else:  # ModelAdmin is generic only in the type stubs
    _ModelAdmin = admin.ModelAdmin

REQUEUEABLE = (Job.Status.FAILED, Job.Status.CANCELLED, Job.Status.DONE)
PAYLOAD_SECTION = "Call"  # the fieldset of a job's args, kwargs and result
PAYLOAD_FIELDS = ("args", "kwargs", "result")
NOT_FINISHED = "only failed, cancelled or done jobs can be requeued."
# Columns the list never shows: left out so a page of 100 jobs does not drag in their
# arguments, results and tracebacks.
LIST_DEFERRED = ("args", "kwargs", "result", "errors")


def status_badge(status: str) -> SafeString:
    label = Job.Status(status).label if status in Job.Status.values else status
    return format_html('<span class="dbq-status dbq-{}">{}</span>', status, label)


def pretty_json(value: Any) -> SafeString:
    text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)
    return format_html('<pre class="dbq-pre">{}</pre>', text)


class JobChangeList(ChangeList):
    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet[Job]:
        return super().get_queryset(request, exclude_parameters).defer(*LIST_DEFERRED)


@admin.register(Job)
class JobAdmin(SchedulingAdmin, _ModelAdmin):
    list_display = (
        "id",
        "task",
        "queue",
        "status_display",
        "priority",
        "attempts_display",
        "run_after",
        "finished_at",
        "error_summary",
    )
    list_display_links = ("id", "task")
    list_filter = (
        ("status", admin.ChoicesFieldListFilter),
        QueueFilter,
        TaskFilter,
        FailedSinceFilter,
    )
    search_fields = ("task",)  # the search itself is get_search_results below
    search_help_text = (
        "A number finds that job id. Other text matches the task path, the worker "
        "(owner) and the error text (a scan: combine it with a filter on big tables)."
    )
    ordering = ("-id",)
    list_per_page = 100
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    paginator = CappedCountPaginator
    # Exact counts up to this many rows; beyond it "more than N" or the table estimate.
    count_limit = 10_000
    actions = (
        "requeue_jobs",
        "requeue_jobs_now",
        "cancel_jobs",
        "run_jobs_now",
        "delete_jobs",
        "pause_queues",
        "resume_queues",
    )
    fieldsets = (
        (None, {"fields": ("id", "task", "queue", "status_display", "priority", "backend")}),
        ("Call", {"fields": ("args_display", "kwargs_display", "result_display")}),
        (
            "Attempts and timing",
            {
                "fields": (
                    "attempts_display",
                    "created_at",
                    "run_after",
                    "started_at",
                    "last_attempted_at",
                    "finished_at",
                    "duration",
                )
            },
        ),
        ("Worker", {"fields": ("owner", "owner_date", "cancel_requested")}),
        ("Errors", {"fields": ("last_error_display", "errors_display")}),
        (
            "Options",
            {
                "fields": (
                    "max_attempts",
                    "timeout",
                    "retry_backoff",
                    "unique_key",
                    "concurrency_key",
                    "concurrency_limit",
                )
            },
        ),
    )
    # Every field is read-only: jobs change state only through the operations.
    readonly_fields = flatten_fieldsets(fieldsets)

    # -- display -----------------------------------------------------------------------

    @admin.display(description="status", ordering="status")
    def status_display(self, job: Job) -> SafeString:
        flag = " (stop requested)" if job.cancel_requested and job.status == "claimed" else ""
        return format_html("{}{}", status_badge(job.status), flag)

    @admin.display(description="attempts")
    def attempts_display(self, job: Job) -> str:
        return f"{job.attempts}/{job.max_attempts}"

    @admin.display(description="error")
    def error_summary(self, job: Job) -> str:
        return dashboard.last_line(job.last_error)

    @admin.display(description="args")
    def args_display(self, job: Job) -> SafeString:
        return pretty_json(job.args)

    @admin.display(description="kwargs")
    def kwargs_display(self, job: Job) -> SafeString:
        return pretty_json(job.kwargs)

    @admin.display(description="result")
    def result_display(self, job: Job) -> SafeString:
        return pretty_json(job.result)

    @admin.display(description="args, kwargs and result")
    def payload_hidden(self, job: Job) -> str:
        return (
            "Hidden: they may hold personal data or secrets. Users who may change jobs see "
            "them (DBQUEUE['ADMIN_SHOW_PAYLOADS'] decides who)."
        )

    @admin.display(description="last error")
    def last_error_display(self, job: Job) -> SafeString | str:
        return (
            format_html('<pre class="dbq-pre">{}</pre>', job.last_error) if job.last_error else "-"
        )

    @admin.display(description="earlier attempts")
    def errors_display(self, job: Job) -> SafeString | str:
        errors = [e for e in job.errors or [] if isinstance(e, dict)]
        if not errors:
            return "-"
        return format_html_join(
            "",
            '<details class="dbq-error"><summary>{} at {}</summary>'
            '<pre class="dbq-pre">{}</pre></details>',
            (
                (e.get("exception_class_path", "?"), e.get("at", "?"), e.get("traceback", ""))
                for e in reversed(errors)
            ),
        )

    @admin.display(description="run time")
    def duration(self, job: Job) -> str:
        started = job.attempt_started_at  # of the last attempt
        if started and job.finished_at:
            return f"{(job.finished_at - started).total_seconds():.3f} s"
        return "-"

    # -- who sees arguments and results -------------------------------------------------

    def payloads_visible(self, request: HttpRequest, job: Job | None = None) -> bool:
        """May this user read jobs' args, kwargs and results? Tracebacks are not payloads:
        an operator who only watches the queue needs them to see what failed."""
        mode = settings.ADMIN_SHOW_PAYLOADS
        if mode == "view":
            return self.has_view_permission(request, job)
        if mode == "change":
            return self.has_change_permission(request, job)
        return False

    def get_fieldsets(self, request: HttpRequest, obj: Job | None = None) -> Any:
        if self.payloads_visible(request, obj):
            return self.fieldsets
        return tuple(
            (name, {"fields": ("payload_hidden",)}) if name == PAYLOAD_SECTION else (name, opts)
            for name, opts in self.fieldsets
        )

    def get_readonly_fields(self, request: HttpRequest, obj: Job | None = None) -> Any:
        # Every field shown is read-only; a field not shown is not on the page at all.
        return flatten_fieldsets(self.get_fieldsets(request, obj))

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest | None = None) -> bool:
        # The admin allows any lookup on a model's own fields from the URL: hidden
        # payloads would be readable one guess at a time (?result__PASSWORD__startswith=h).
        if lookup.split("__", 1)[0] in PAYLOAD_FIELDS and (
            request is None or not self.payloads_visible(request)
        ):
            return False
        return super().lookup_allowed(lookup, value, request)  # type: ignore[arg-type]

    # -- list --------------------------------------------------------------------------

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return JobChangeList

    def get_paginator(
        self,
        request: HttpRequest,
        queryset: QuerySet[Job],
        per_page: int,
        orphans: int = 0,
        allow_empty_first_page: bool = True,
    ) -> CappedCountPaginator:
        return CappedCountPaginator(
            queryset, per_page, orphans, allow_empty_first_page, limit=self.count_limit
        )

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Job], search_term: str
    ) -> tuple[QuerySet[Job], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        job_id = parse_job_id(term.lstrip("#"))
        if job_id is not None:
            return queryset.filter(pk=job_id), False
        matches = Q(task__icontains=term) | Q(owner__icontains=term) | Q(last_error__icontains=term)
        return queryset.filter(matches), False

    def get_actions(self, request: HttpRequest, action_location: Any = None) -> dict[str, Any]:
        # Django 6.1 asks per location (the list or the change form) and deprecates
        # overrides without the parameter; 5.2 and 6.0 have no such parameter.
        where = {} if action_location is None else {"action_location": action_location}
        actions = super().get_actions(request, **where)
        # Django's own bulk delete lists every object on its confirmation page, which a
        # million-row selection cannot survive; delete_jobs replaces it.
        actions.pop("delete_selected", None)
        return actions

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        refuse_crafted_lookups(self.model, request.GET)  # a 400, not a 500 from SQL
        action = request.POST.get("action", "") if request.method == "POST" else ""
        if action and action not in self.get_actions(request):
            # Django would answer "No action selected"; a refused action is a 403.
            raise PermissionDenied(f"You may not run the action {action!r} on jobs.")
        return super().changelist_view(request, extra_context)

    # -- permissions and the read-only detail page -------------------------------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # jobs come from enqueue(), which validates them

    def has_delete_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        if obj is not None and obj.status == Job.Status.CLAIMED:
            return False  # a worker is running it: cancel it first
        return super().has_delete_permission(request, obj)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        if request.method == "POST":
            # Every field is read-only: changes go through the operation buttons.
            raise PermissionDenied("Jobs are changed with the Requeue/Cancel/Run now buttons.")
        context = dict(extra_context or {})
        context.update(
            show_save=False, show_save_and_continue=False, show_save_and_add_another=False
        )
        job = self.get_object(request, object_id)
        if job is not None and self.has_change_permission(request, job):
            context["operations"] = self.operations_for(job)
        return super().change_view(request, object_id, form_url, context)

    @staticmethod
    def operations_for(job: Job) -> list[tuple[str, str]]:
        """(operation, button label) that make sense for a job in its current state."""
        if job.status in REQUEUEABLE:
            return [("requeue", "Requeue"), ("requeue_now", "Requeue and run now")]
        if job.status == Job.Status.QUEUED:
            return [("run_now", "Run now"), ("cancel", "Cancel")]
        if job.status == Job.Status.CLAIMED and not job.cancel_requested:
            return [("cancel", "Ask the worker to stop it")]
        return []

    # -- actions -----------------------------------------------------------------------

    def _apply(
        self,
        request: HttpRequest,
        queryset: QuerySet[Job],
        operation: Callable[[JobQuerySet], int],
        done: str,
        why: str,
    ) -> None:
        """Run ``operation`` over the selection and tell how many jobs it changed
        (``done`` has a ``{n}``) and how many it left alone, and ``why``."""
        selected, counts = apply_in_chunks(queryset, operation)
        changed = sum(counts)
        self.message_user(request, done.format(n=changed), messages.SUCCESS)
        if selected > changed:
            self.message_user(
                request,
                f"{selected - changed} selected job(s) left unchanged: {why}",
                messages.WARNING,
            )

    def _requeue(self, request: HttpRequest, queryset: QuerySet[Job], run_now: bool) -> None:
        selected, reports = apply_in_chunks(queryset, lambda qs: qs.requeue_report(run_now))
        report = RequeueReport(
            requeued=sum(r.requeued for r in reports),
            key_held=[held for r in reports for held in r.key_held],
        )
        done = "Requeued {n} job(s) to run now." if run_now else "Requeued {n} job(s)."
        self.message_user(request, done.format(n=report.requeued), messages.SUCCESS)
        if report.key_held:
            self.message_user(request, report.describe(), messages.WARNING)
        others = selected - report.requeued - len(report.key_held)
        if others > 0:
            self.message_user(
                request,
                f"{others} selected job(s) left unchanged: {NOT_FINISHED}",
                messages.WARNING,
            )

    @admin.action(permissions=["change"], description="Requeue (failed, cancelled or done)")
    def requeue_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        self._requeue(request, queryset, run_now=False)

    @admin.action(permissions=["change"], description="Requeue and run now")
    def requeue_jobs_now(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        self._requeue(request, queryset, run_now=True)

    @admin.action(
        permissions=["change"], description="Cancel (queued; running ones are asked to stop)"
    )
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        selected, results = apply_in_chunks(queryset, lambda qs: qs.cancel())
        cancelled = sum(r[0] for r in results)
        asked = sum(r[1] for r in results)
        self.message_user(request, f"Cancelled {cancelled} queued job(s).", messages.SUCCESS)
        if asked:
            self.message_user(
                request,
                f"Asked the workers running {asked} job(s) to stop them; they are recorded "
                "as cancelled when the worker notices.",
                messages.WARNING,
            )
        if selected > cancelled + asked:
            self.message_user(
                request,
                f"{selected - cancelled - asked} selected job(s) left unchanged: they had "
                "already finished.",
                messages.WARNING,
            )

    @admin.action(permissions=["change"], description="Run now (queued)")
    def run_jobs_now(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        self._apply(
            request,
            queryset,
            lambda qs: qs.run_now(),
            "{n} job(s) will run as soon as a worker is free.",
            "only queued jobs can be run now.",
        )

    @admin.action(permissions=["change"], description="Pause the queues of these jobs")
    def pause_queues(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        self._switch_selected(request, queryset, pause=True)

    @admin.action(permissions=["change"], description="Resume the queues of these jobs")
    def resume_queues(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        self._switch_selected(request, queryset, pause=False)

    @admin.action(permissions=["delete"], description="Delete (except running jobs)")
    def delete_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> HttpResponse | None:
        if request.POST.get("post") != "yes":
            paginator = CappedCountPaginator(queryset, 1, limit=self.count_limit)
            context = {
                **self.admin_site.each_context(request),
                "title": "Delete jobs?",
                "opts": self.model._meta,
                "count_label": paginator.count_label,
                "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
                "select_across": request.POST.get("select_across", "0"),
                "action": request.POST.get("action", ""),
            }
            return TemplateResponse(
                request, "admin/django_dbqueue/job/delete_jobs_confirmation.html", context
            )
        self._apply(
            request,
            queryset,
            lambda qs: qs.delete_unclaimed(),
            "Deleted {n} job(s).",
            "running jobs are not deleted; cancel them first.",
        )
        return None

    # -- extra pages: dashboard and one-job operations ---------------------------------

    def get_urls(self) -> list[URLPattern]:
        info = self.opts.app_label, self.opts.model_name
        extra = [
            path(
                "dashboard/",
                self.admin_site.admin_view(self.dashboard_view),
                name="{}_{}_dashboard".format(*info),
            ),
            path(
                "<path:object_id>/operate/",
                self.admin_site.admin_view(require_POST(self.operate_view)),
                name="{}_{}_operate".format(*info),
            ),
        ]
        return extra + self.scheduling_urls() + super().get_urls()

    def dashboard_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied("Viewing jobs is required for the dashboard.")
        now = timezone.now()
        context = {
            **self.admin_site.each_context(request),
            "title": "Job queue dashboard",
            "opts": self.opts,
            "now": now,
            "statuses": dashboard.STATUSES,
            "queues": dashboard.queue_rows(now, self.count_limit),
            "chart": dashboard.throughput_chart(now),
            "workers": dashboard.worker_rows(now),
            "failures": dashboard.recent_failures(),
            "can_change": self.has_change_permission(request),
            "count_limit": self.count_limit,
            **dashboard_context(),
        }
        return TemplateResponse(request, "admin/django_dbqueue/dashboard.html", context)

    def operate_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        job_id = parse_job_id(object_id)
        if job_id is None:
            raise Http404(f"{object_id[:30]!r} is not a job id.")
        job = get_object_or_404(Job, pk=job_id)
        if not self.has_change_permission(request, job):
            raise PermissionDenied("Changing jobs is required to requeue, cancel or run them.")
        operation = request.POST.get("operation", "")
        jobs = Job.objects.filter(pk=job.pk)
        level, message = messages.SUCCESS, ""
        if operation in ("requeue", "requeue_now"):
            report = jobs.requeue_report(run_now=operation == "requeue_now")
            if report.requeued:
                message = f"Job #{job.pk} requeued."
            elif report.key_held:
                level, message = messages.ERROR, report.describe()
            else:
                level, message = (
                    messages.ERROR,
                    (
                        f"Job #{job.pk} was not requeued: it is {job.refresh_status()}; only "
                        "failed, cancelled or done jobs can be requeued."
                    ),
                )
        elif operation == "cancel":
            cancelled, asked = jobs.cancel()
            if cancelled:
                message = f"Job #{job.pk} cancelled."
            elif asked:
                level = messages.WARNING
                message = (
                    f"Job #{job.pk} is running: its worker was asked to stop it and will "
                    "record it as cancelled."
                )
            else:
                level, message = (
                    messages.ERROR,
                    (
                        f"Job #{job.pk} was not cancelled: it is {job.refresh_status()}, "
                        "already finished."
                    ),
                )
        elif operation == "run_now":
            if jobs.run_now():
                message = f"Job #{job.pk} will run as soon as a worker is free."
            else:
                level, message = (
                    messages.ERROR,
                    (f"Job #{job.pk} is {job.refresh_status()}: only queued jobs can be run now."),
                )
        else:
            level, message = messages.ERROR, f"Unknown operation {operation!r}."
        self.message_user(request, message, level)
        target = request.POST.get("next", "")
        if not url_has_allowed_host_and_scheme(
            target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
        ):
            target = reverse(
                f"admin:{self.opts.app_label}_{self.opts.model_name}_change", args=[job.pk]
            )
        return HttpResponseRedirect(target)
