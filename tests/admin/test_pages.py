"""The app's own admin pages: per-task figures of the last hour in a fixed number of
queries, breadcrumbs in the running admin's markup, no inline script or style (a strict
CSP), times to the second, "Worker processes"."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

import django
import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_dbqueue.admin import figures
from django_dbqueue.admin.pages import breadcrumbs_as_list, exact_time
from django_dbqueue.models import Job, WorkerProcess
from django_dbqueue.queue.dialects import dialect
from tests.admin.test_jobs import CHANGELIST, DASHBOARD, login, staff

pytestmark = pytest.mark.django_db

S = Job.Status
SCHEDULES = "admin:django_dbqueue_job_schedules"


def finished(
    task: str, status: str, end: datetime, run: float, wait: float, retried: bool = False
) -> Job:
    """A job that finished at ``end`` after running ``run`` s, due ``wait`` s before it
    started (``retried``: its last attempt was not its first)."""
    start = end - timedelta(seconds=run)
    due = start - timedelta(seconds=wait)
    times: dict[str, Any] = (
        {"started_at": due - timedelta(minutes=5), "last_attempted_at": start}
        if retried
        else {"started_at": start}
    )
    return Job(
        task=task,
        status=status,
        run_after=due,
        created_at=due - timedelta(minutes=10),
        finished_at=end,
        attempts=2 if retried else 1,
        **times,
    )


def test_task_figures_count_rate_and_percentiles() -> None:
    now = timezone.now()
    end = now - timedelta(minutes=1)
    rows = [finished("a.quick", S.DONE, end, run=0.1 * (i + 1), wait=i * 1.0) for i in range(20)]
    rows += [finished("a.quick", S.FAILED, end, run=5.0, wait=0.5, retried=True)]
    rows += [finished("b.slow", S.DONE, end, run=30.0, wait=2.0) for _ in range(3)]
    # Outside the hour, or not finished: not counted.
    rows += [finished("a.quick", S.DONE, now - timedelta(minutes=61), run=99.0, wait=99.0)]
    rows += [Job(task="a.quick", status=S.QUEUED), Job(task="c.never", status=S.CANCELLED)]
    Job.objects.bulk_create(rows)

    quick, slow = figures.task_figures(now)
    assert (quick.task, quick.done, quick.failed, quick.count) == ("a.quick", 20, 1, 21)
    assert quick.failure_label == "4.8 %"
    # Run times 0.1..2.0 and 5.0: nearest rank 11 of 21 is 1.1 s, rank 20 is 2.0 s.
    assert (quick.run_p50, quick.run_p95) == ("1.10 s", "2.00 s")
    # Waits 0..19 and 0.5 (the retried job's last attempt, not its first).
    assert (quick.wait_p50, quick.wait_p95) == ("9.00 s", "18 s")
    assert not quick.sampled
    assert (slow.task, slow.count, slow.failure_label, slow.run_p50) == (
        "b.slow",
        3,
        "0.0 %",
        "30 s",
    )


def test_task_figures_read_a_bounded_sample_and_say_so() -> None:
    now = timezone.now()
    Job.objects.bulk_create(
        finished("a.many", S.DONE, now - timedelta(seconds=i), run=1.0, wait=0.0) for i in range(30)
    )
    (row,) = figures.task_figures(now, sample=10)
    assert (row.count, row.read, row.sampled) == (30, 10, True)  # counts exact, times sampled
    assert row.run_p95 == "1.00 s"


def dashboard_queries(client: Client) -> int:
    """The dashboard's queries, not counting a read of the database's clock (made at most
    every few seconds, whichever request comes then: queue/clock.py)."""
    clock_sql = dialect(connection).clock_sql
    with CaptureQueriesContext(connection) as queries:
        response = client.get(reverse(DASHBOARD))
    assert response.status_code == 200
    return len([q for q in queries if not clock_sql or q["sql"] != clock_sql])


def test_the_dashboard_makes_as_many_queries_for_many_rows_and_tasks_as_for_few(
    operator: Client,
) -> None:
    now = timezone.now()
    Job.objects.bulk_create(
        [finished("t.one", S.DONE, now, 1.0, 0.1), finished("t.two", S.FAILED, now, 1.0, 0.1)]
    )
    few = dashboard_queries(operator)
    Job.objects.bulk_create(
        finished(f"t.task{i % 40}", S.FAILED if i % 7 == 0 else S.DONE, now, i % 13, i % 5)
        for i in range(2_000)
    )
    WorkerProcess.objects.create(name="w:1:a", host="w", pid=1, heartbeat_at=now)
    response = operator.get(reverse(DASHBOARD))
    assert len(response.context["tasks"]) == 42
    assert dashboard_queries(operator) == few
    # The task figures themselves: four statements whatever the rows.
    with CaptureQueriesContext(connection) as queries:
        figures.task_figures(now)
    assert len(queries) == 4


def test_the_task_figures_take_four_queries(django_assert_max_num_queries: Any) -> None:
    now = timezone.now()
    Job.objects.bulk_create(finished(f"t.task{i % 25}", S.DONE, now, 0.5, 0.5) for i in range(500))
    with django_assert_max_num_queries(4):
        assert len(figures.task_figures(now)) == 25


def test_breadcrumbs_use_the_running_admins_markup(operator: Client) -> None:
    list_markup = django.VERSION >= (6, 1)
    assert breadcrumbs_as_list() is list_markup
    own = operator.get(reverse(CHANGELIST)).content.decode()  # Django's own page
    for name in (DASHBOARD, SCHEDULES):
        page = operator.get(reverse(name)).content.decode()
        crumbs = re.search(r'<nav aria-label="Breadcrumbs">\s*(<\w+ class="breadcrumbs">)', page)
        mine = re.search(r'<nav aria-label="Breadcrumbs">\s*(<\w+ class="breadcrumbs">)', own)
        assert crumbs and mine and crumbs.group(1) == mine.group(1), name
        assert ('<li aria-current="page">' in page) is list_markup
        assert f'<a href="{reverse(CHANGELIST)}">Jobs</a>' in page


def test_no_inline_script_or_style_so_a_strict_csp_allows_the_pages(operator: Client) -> None:
    job = Job.objects.create(task="tests.support.jobs.add", status=S.FAILED, last_error="boom")
    for url in (
        reverse(DASHBOARD),
        reverse(SCHEDULES),
        reverse(CHANGELIST),
        reverse("admin:django_dbqueue_job_change", args=[job.pk]),
    ):
        page = operator.get(url).content.decode()
        assert re.findall(r"<script(?![^>]*\bsrc=)[^>]*>", page) == [], url
        assert "<style" not in page and " style=" not in page, url
    dashboard = operator.get(reverse(DASHBOARD)).content.decode()
    assert re.search(r'<script src="[^"]*django_dbqueue/dashboard\.js" defer>', dashboard)
    assert 'id="dbq-refresh"' in dashboard


def test_times_are_shown_to_the_second(operator: Client) -> None:
    at = timezone.now().replace(microsecond=0) - timedelta(days=2, seconds=7)
    job = Job.objects.create(
        task="tests.support.jobs.add", status=S.DONE, run_after=at, started_at=at, finished_at=at
    )
    page = operator.get(reverse("admin:django_dbqueue_job_change", args=[job.pk])).content
    assert page.decode().count(exact_time(at)) >= 3  # run after, started, finished
    assert at.strftime("%Y-%m-%d %H:%M:%S") == exact_time(at)  # the test runs in UTC
    listed = operator.get(reverse(CHANGELIST)).content.decode()
    assert f'title="{exact_time(at)}">{exact_time(at)}</span>' in listed  # not today: in full


def test_the_worker_list_says_worker_processes(operator: Client) -> None:
    assert str(WorkerProcess._meta.verbose_name_plural) == "worker processes"
    user = staff("watcher", "view_workerprocess", "view_job")
    index = login(user).get(reverse("admin:app_list", args=["django_dbqueue"])).content.decode()
    assert "Worker processes" in index and "Worker processs" not in index
