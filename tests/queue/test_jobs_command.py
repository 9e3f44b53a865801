"""``manage.py dbqueue_jobs``: the operator's shell over queue/actions.py."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from django_dbqueue import enqueue
from django_dbqueue.models import Job
from tests.support import jobs

pytestmark = pytest.mark.django_db(transaction=True)


def run(*args: str) -> str:
    out = StringIO()
    call_command("dbqueue_jobs", *args, stdout=out)
    return out.getvalue()


def failed(key: str, queue: str = "default") -> Job:
    job = enqueue(jobs.record, [key], queue=queue)
    Job.objects.filter(pk=job.pk).update(
        status=Job.Status.FAILED, finished_at=timezone.now(), attempts=3, last_error="Boom\n"
    )
    return job


def test_list_filters_by_status_queue_task_and_key_and_prints_json() -> None:
    bad = failed("a")
    queued = enqueue(jobs.add, [1, 2], concurrency_key="k", concurrency_limit=1)
    other = enqueue(jobs.record, ["b"], queue="emails", unique_key="u")
    rows = json.loads(run("list", "--status", "failed", "--json"))
    assert [row["id"] for row in rows] == [bad.pk]
    assert rows[0]["last_error"] == "Boom\n"
    assert [r["id"] for r in json.loads(run("list", "--queue", "emails", "--json"))] == [other.pk]
    by_task = json.loads(run("list", "--task", "tests.support.jobs.add", "--json"))
    assert [r["id"] for r in by_task] == [queued.pk]
    assert [r["id"] for r in json.loads(run("list", "--key", "k", "--json"))] == [queued.pk]
    assert [r["id"] for r in json.loads(run("list", "--key", "u", "--json"))] == [other.pk]
    text = run("list")
    assert f"#{bad.pk}" in text and "failed" in text and "Boom" in text
    assert run("list", "--task", "no.such.task") == "No job matches.\n"


def test_show_hides_payloads_unless_asked() -> None:
    job = enqueue(jobs.record, ["secret-argument"])
    shown = run("show", str(job.pk))
    assert "secret-argument" not in shown
    assert "hidden" in shown
    assert "secret-argument" in run("show", str(job.pk), "--payloads")
    data = json.loads(run("show", str(job.pk), "--json"))
    assert data["id"] == job.pk and "args" not in data
    assert json.loads(run("show", str(job.pk), "--json", "--payloads"))["args"] == [
        "secret-argument"
    ]
    with pytest.raises(CommandError, match="no job #999999"):
        run("show", "999999")


def test_requeue_and_retry_failed_count_and_dry_run_changes_nothing() -> None:
    first, second = failed("a"), failed("b", queue="emails")
    assert "Would requeue 2 job(s)" in run("retry-failed", "--dry-run")
    assert Job.objects.filter(status=Job.Status.FAILED).count() == 2
    assert "Requeued 1 of 1" in run("requeue", str(first.pk))
    assert Job.objects.get(pk=first.pk).status == Job.Status.QUEUED
    assert Job.objects.get(pk=first.pk).attempts == 0
    assert "Requeued 1 of 1" in run("retry-failed", "--queue", "emails")
    assert Job.objects.get(pk=second.pk).status == Job.Status.QUEUED
    assert "Requeued 0 of 0" in run("retry-failed")


def test_cancel_needs_ids_or_filters_and_cancels_queued_jobs() -> None:
    keep = enqueue(jobs.record, ["keep"], queue="emails")
    drop = enqueue(jobs.record, ["drop"])
    with pytest.raises(CommandError, match="Name the jobs"):
        run("cancel")
    assert "Would cancel 1 queued" in run("cancel", "--queue", "default", "--dry-run")
    assert Job.objects.get(pk=drop.pk).status == Job.Status.QUEUED
    assert "Cancelled 1 queued" in run("cancel", "--queue", "default")
    assert Job.objects.get(pk=drop.pk).status == Job.Status.CANCELLED
    assert Job.objects.get(pk=keep.pk).status == Job.Status.QUEUED


def test_bad_arguments_are_refused_without_a_traceback() -> None:
    with pytest.raises(CommandError):
        run("requeue", "-3")
    with pytest.raises(CommandError):
        run("list", "--since", "soon")
    with pytest.raises(CommandError):
        run("list", "--status", "exploded")
