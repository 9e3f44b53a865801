"""The job pages of the admin: job list, job detail and the dashboard view.

The actions and the detail page's buttons are admin/operations.py's; the list stays
cheap on tables with millions of rows (admin/filters.py, admin/paginator.py).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, ClassVar

from django.contrib import admin
from django.contrib.admin.utils import flatten_fieldsets
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.db.models.functions import Coalesce
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.views.decorators.http import require_POST

from django_dbqueue.admin import dashboard, figures
from django_dbqueue.admin.filters import (
    FailedSinceFilter,
    QueueFilter,
    TaskFilter,
    parse_job_id,
)
from django_dbqueue.admin.lookups import refuse_crafted_lookups
from django_dbqueue.admin.operations import JobOperations
from django_dbqueue.admin.pages import TIME_SUFFIX, page_context, short_time, time_column
from django_dbqueue.admin.paginator import CappedCountPaginator
from django_dbqueue.admin.scheduling import dashboard_context
from django_dbqueue.conf import settings
from django_dbqueue.models import Job
from django_dbqueue.options import COLUMNS
from django_dbqueue.queue import clock

if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[Job]
else:  # ModelAdmin is generic only in the type stubs
    _ModelAdmin = admin.ModelAdmin

PAYLOAD_SECTION = "Call"  # the fieldset of a job's args, kwargs and result
PAYLOAD_FIELDS = ("args", "kwargs", "result")
# Columns the list never shows: left out so a page of 100 jobs does not drag in their
# arguments, results and tracebacks.
LIST_DEFERRED = ("args", "kwargs", "result", "errors")


def status_badge(status: str) -> SafeString:
    label = Job.Status(status).label if status in Job.Status.values else status
    return format_html('<span class="dbq-status dbq-{}">{}</span>', status, label)


def pretty_json(value: Any) -> SafeString:
    text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)
    return format_html('<pre class="dbq-pre">{}</pre>', text)


def options_not_in(fieldsets: Any) -> tuple[str, ...]:
    """Every option a job keeps in a column (``options.COLUMNS``) not in ``fieldsets``."""
    shown = {name.removesuffix(TIME_SUFFIX) for name in flatten_fieldsets(fieldsets)}
    return tuple(name for name in COLUMNS if name not in shown)


class JobChangeList(ChangeList):
    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet[Job]:
        return super().get_queryset(request, exclude_parameters).defer(*LIST_DEFERRED)


@admin.register(Job)
class JobAdmin(JobOperations, _ModelAdmin):
    list_display = (
        "id",
        "task",
        "queue",
        "status_display",
        "attempts_display",
        "when_short",
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
    # The dashboard's "Refresh every N s" toggle (off until a user turns it on).
    dashboard_refresh_seconds = 10
    actions = (
        "requeue_jobs",
        "requeue_jobs_now",
        "cancel_jobs",
        "run_jobs_now",
        "delete_jobs",
        "pause_queues",
        "resume_queues",
    )
    # What happened first (status, the error's last line, attempts; the buttons are
    # above), the traceback in a section of its own, then when, the call, the worker.
    fieldsets: ClassVar[Any] = (
        (
            None,
            {
                "fields": (
                    "status_display",
                    "error_summary",
                    "attempts_display",
                    "task",
                    "queue",
                    "id",
                    "priority",
                    "backend",
                )
            },
        ),
        ("Traceback", {"fields": ("last_error_display", "errors_display")}),
        (
            "Timing",
            {
                "fields": (
                    "created_at_time",
                    "run_after_time",
                    "started_at_time",
                    "last_attempted_at_time",
                    "finished_at_time",
                    "duration",
                )
            },
        ),
        ("Call", {"fields": ("args_display", "kwargs_display", "result_display")}),
        ("Worker", {"fields": ("owner", "owner_date_time", "cancel_requested")}),
    )
    # Then every option the job keeps in a column.
    fieldsets += (("Options", {"fields": options_not_in(fieldsets), "classes": ["collapse"]}),)
    # Every field is read-only: jobs change state only through the operations.
    readonly_fields = flatten_fieldsets(fieldsets)

    # -- display -----------------------------------------------------------------------

    created_at_time = time_column("created_at")
    run_after_time = time_column("run_after")
    started_at_time = time_column("started_at")
    last_attempted_at_time = time_column("last_attempted_at")
    finished_at_time = time_column("finished_at")
    owner_date_time = time_column("owner_date")

    # The list's columns are headed briefly and its two times share one column: at 1280
    # px, beside the admin's sidebar and the filters, the table has about 630 px.
    @admin.display(description="when", ordering=Coalesce("finished_at", "run_after"))
    def when_short(self, job: Job) -> SafeString | str:
        """When a finished job ended; when any other is due."""
        return short_time(job.finished_at or job.run_after)

    @admin.display(description="status", ordering="status")
    def status_display(self, job: Job) -> SafeString:
        flag = " (stop requested)" if job.cancel_requested and job.status == "claimed" else ""
        return format_html("{}{}", status_badge(job.status), flag)

    @admin.display(description="tries")
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
        if started and job.status == Job.Status.CLAIMED:
            return f"running for {(clock.queue_now() - started).total_seconds():.0f} s"
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
        now = clock.queue_now()
        tasks = figures.task_figures(now)
        context = {
            **page_context(self, request, "Job queue dashboard"),
            "now": now,
            "refresh_seconds": self.dashboard_refresh_seconds,
            "statuses": dashboard.STATUSES,
            "queues": dashboard.queue_rows(now, self.count_limit),
            "tasks": tasks,
            "tasks_sampled": any(row.sampled for row in tasks),
            "sample": figures.SAMPLE,
            "chart": dashboard.throughput_chart(now),
            "workers": dashboard.worker_rows(now),
            "failures": dashboard.recent_failures(),
            "can_change": self.has_change_permission(request),
            "count_limit": self.count_limit,
            **dashboard_context(),
        }
        return TemplateResponse(request, "admin/django_dbqueue/dashboard.html", context)
