"""What an operator does to jobs from the admin: the job list's actions and the detail
page's buttons (requeue, cancel, run now), each a call of the library
(:class:`django_dbqueue.queue.actions.JobQuerySet`). Large selections ("all N matching
the filter") are worked through in chunks of primary keys (admin/chunked.py) so no
single statement locks a big range of the table the workers claim from.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme

from django_dbqueue.admin.chunked import apply_in_chunks
from django_dbqueue.admin.filters import parse_job_id
from django_dbqueue.admin.pages import page_context
from django_dbqueue.admin.paginator import CappedCountPaginator
from django_dbqueue.admin.scheduling import SchedulingAdmin
from django_dbqueue.models import Job
from django_dbqueue.queue.actions import JobQuerySet, RequeueReport

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

    _Base = ModelAdmin[Job]
else:
    _Base = object

REQUEUEABLE = (Job.Status.FAILED, Job.Status.CANCELLED, Job.Status.DONE)
NOT_FINISHED = "only failed, cancelled or done jobs can be requeued."


class JobOperations(SchedulingAdmin, _Base):
    """The job admin's actions and buttons (JobAdmin lists the actions it offers)."""

    count_limit: int  # JobAdmin's: exact counts up to this many rows

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
                **page_context(self, request, "Delete jobs?"),
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

    def operate_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """One button of a job's detail page: requeue, requeue_now, cancel or run_now."""
        job_id = parse_job_id(object_id)
        if job_id is None:
            raise Http404(f"{object_id[:30]!r} is not a job id.")
        job = get_object_or_404(Job, pk=job_id)
        if not self.has_change_permission(request, job):
            raise PermissionDenied("Changing jobs is required to requeue, cancel or run them.")
        operation = request.POST.get("operation", "")
        operate = OPERATIONS.get(operation)
        if operate is None:
            level, message = messages.ERROR, f"Unknown operation {operation!r}."
        else:
            level, message = operate(job, operation)
        self.message_user(request, message, level)
        target = request.POST.get("next", "")
        if not url_has_allowed_host_and_scheme(
            target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
        ):
            target = reverse(
                f"admin:{self.opts.app_label}_{self.opts.model_name}_change", args=[job.pk]
            )
        return HttpResponseRedirect(target)


def _requeue_one(job: Job, operation: str) -> tuple[int, str]:
    report = (
        Job.objects.primary().filter(pk=job.pk).requeue_report(run_now=operation == "requeue_now")
    )
    if report.requeued:
        return messages.SUCCESS, f"Job #{job.pk} requeued."
    if report.key_held:
        return messages.ERROR, report.describe()
    return messages.ERROR, (
        f"Job #{job.pk} was not requeued: it is {job.refresh_status()}; only "
        "failed, cancelled or done jobs can be requeued."
    )


def _cancel_one(job: Job, operation: str) -> tuple[int, str]:
    cancelled, asked = Job.objects.primary().filter(pk=job.pk).cancel()
    if cancelled:
        return messages.SUCCESS, f"Job #{job.pk} cancelled."
    if asked:
        return messages.WARNING, (
            f"Job #{job.pk} is running: its worker was asked to stop it and will "
            "record it as cancelled."
        )
    return messages.ERROR, (
        f"Job #{job.pk} was not cancelled: it is {job.refresh_status()}, already finished."
    )


def _run_one_now(job: Job, operation: str) -> tuple[int, str]:
    if Job.objects.primary().filter(pk=job.pk).run_now():
        return messages.SUCCESS, f"Job #{job.pk} will run as soon as a worker is free."
    return messages.ERROR, (
        f"Job #{job.pk} is {job.refresh_status()}: only queued jobs can be run now."
    )


# The detail page's buttons (JobOperations.operations_for offers them): (level, message).
OPERATIONS: dict[str, Callable[[Job, str], tuple[int, str]]] = {
    "requeue": _requeue_one,
    "requeue_now": _requeue_one,
    "cancel": _cancel_one,
    "run_now": _run_one_now,
}
