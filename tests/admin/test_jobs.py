"""The job admin through Django's test client: permissions, actions, escaping, query cost."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_dbqueue.admin import chunked
from django_dbqueue.admin import jobs as job_admin
from django_dbqueue.models import Job, WorkerProcess

pytestmark = pytest.mark.django_db

S = Job.Status
CHANGELIST = "admin:django_dbqueue_job_changelist"
DASHBOARD = "admin:django_dbqueue_job_dashboard"
XSS = "<script>alert('x')</script>"


def staff(username: str, *codenames: str) -> User:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    return user


def login(user: User, **client_options: bool) -> Client:
    client = Client(**client_options)
    client.force_login(user)
    return client


@pytest.fixture
def viewer() -> Client:
    return login(staff("viewer", "view_job"))


def make(status: str = S.QUEUED, **fields: object) -> Job:
    fields.setdefault("task", "tests.support.jobs.add")
    return Job.objects.create(status=status, **fields)


def post_action(client: Client, action: str, jobs: list[Job], query: str = "", **extra: str):  # type: ignore[no-untyped-def]
    data = {"action": action, "index": "0", "_selected_action": [str(j.pk) for j in jobs], **extra}
    return client.post(reverse(CHANGELIST) + query, data, follow=True)


def messages_of(response) -> list[str]:  # type: ignore[no-untyped-def]
    return [str(m) for m in response.context["messages"]]


# -- list ------------------------------------------------------------------------------


def test_changelist_shows_status_and_filters(operator: Client) -> None:
    failed = make(S.FAILED, queue="emails", last_error="Traceback\nValueError: bad address")
    make(S.DONE, queue="default", task="tests.support.jobs.noop")
    page = operator.get(reverse(CHANGELIST)).content.decode()
    assert 'class="dbq-status dbq-failed"' in page
    assert "ValueError: bad address" in page
    for query, expected in [
        ("?status__exact=failed", [failed.pk]),
        ("?queue=emails", [failed.pk]),
        ("?task=tests.support.jobs.add", [failed.pk]),
        ("?failed_since=1h", []),
        ("?q=bad+address", [failed.pk]),
        (f"?q=%23{failed.pk}", [failed.pk]),
        ("?q=noop", [Job.objects.get(task="tests.support.jobs.noop").pk]),
    ]:
        response = operator.get(reverse(CHANGELIST) + query)
        assert response.status_code == 200, query
        shown = [job.pk for job in response.context["cl"].result_list]
        if query == "?failed_since=1h":
            # finished_at was never set on this failure: it is not "since an hour".
            expected = []
        assert shown == expected, query
    Job.objects.filter(pk=failed.pk).update(finished_at=timezone.now())
    response = operator.get(reverse(CHANGELIST) + "?failed_since=1h")
    assert [job.pk for job in response.context["cl"].result_list] == [failed.pk]


def test_changelist_never_counts_the_whole_table_and_has_no_per_row_queries(
    operator: Client,
) -> None:
    def count_queries(rows: int) -> list[str]:
        Job.objects.bulk_create(Job(task="tests.support.jobs.add", args=[i]) for i in range(rows))
        with CaptureQueriesContext(connection) as captured:
            assert operator.get(reverse(CHANGELIST)).status_code == 200
        return [q["sql"] for q in captured.captured_queries]

    few = count_queries(3)
    many = count_queries(60)
    assert len(few) == len(many), "no query per displayed row"
    counts = [sql for sql in many if "COUNT(" in sql.upper() and "dbqueue_job" in sql]
    assert counts, "the paginator does count (bounded)"
    for sql in counts:
        assert "LIMIT" in sql.upper(), f"unbounded count: {sql}"


@pytest.mark.django_db(transaction=True)  # MySQL's ANALYZE TABLE commits implicitly
def test_big_table_count_is_an_estimate_or_a_lower_bound(
    operator: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(job_admin.JobAdmin, "count_limit", 20)
    Job.objects.bulk_create(Job(task="tests.support.jobs.add", args=[i]) for i in range(45))
    make(S.FAILED)
    with connection.cursor() as cursor:
        cursor.execute(
            "ANALYZE TABLE dbqueue_job" if connection.vendor == "mysql" else "ANALYZE dbqueue_job"
        )
        cursor.fetchall() if connection.vendor == "mysql" else None
    page = operator.get(reverse(CHANGELIST)).content.decode()
    # The planner's estimate of 46 rows (approximate on InnoDB, which samples pages).
    match = re.search(r"about ([\d,]+) jobs", page)
    assert match, page[page.find('class="paginator"') :][:300]
    assert 20 < int(match.group(1).replace(",", "")) < 200
    page = operator.get(reverse(CHANGELIST) + "?status__exact=queued").content.decode()
    assert "more than 20 jobs" in page
    assert "Select all more than 20 matching jobs" in page
    page = operator.get(reverse(CHANGELIST) + "?status__exact=failed").content.decode()
    assert re.search(r"\b1 job\b", page)


# -- detail ----------------------------------------------------------------------------


def test_change_page_pretty_prints_and_escapes(operator: Client) -> None:
    job = make(
        S.FAILED,
        args=[XSS, {"nested": [1, 2]}],
        kwargs={"lang": XSS},
        result=None,
        last_error=f"Traceback (most recent call last):\nValueError: {XSS}",
        errors=[{"exception_class_path": XSS, "traceback": XSS, "at": "2026-01-01T00:00:00"}],
    )
    response = operator.get(reverse("admin:django_dbqueue_job_change", args=[job.pk]))
    page = response.content.decode()
    assert response.status_code == 200
    assert "<script>alert" not in page
    assert page.count("&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;") >= 5
    assert "&quot;nested&quot;: [\n" in page, "JSON is indented"
    assert 'name="operation" value="requeue"' in page
    assert 'name="_save"' not in page, "the form itself is read-only"


def test_change_page_buttons_follow_the_status(operator: Client, viewer: Client) -> None:
    claimed = make(S.CLAIMED, owner="w1")
    page = operator.get(reverse("admin:django_dbqueue_job_change", args=[claimed.pk])).content
    assert b"Ask the worker to stop it" in page
    assert b"/delete/" not in page, "a running job cannot be deleted"
    page = viewer.get(reverse("admin:django_dbqueue_job_change", args=[claimed.pk])).content
    assert b'name="operation"' not in page


# -- actions ---------------------------------------------------------------------------


def test_bulk_actions(operator: Client) -> None:
    failed, done = make(S.FAILED, attempts=3), make(S.DONE)
    queued, claimed = make(S.QUEUED), make(S.CLAIMED, owner="w1")

    response = post_action(operator, "requeue_jobs", [failed, done, queued])
    assert messages_of(response) == [
        "Requeued 2 job(s).",
        "1 selected job(s) left unchanged: only failed, cancelled or done jobs can be requeued.",
    ]
    failed.refresh_from_db()
    assert (failed.status, failed.attempts) == (S.QUEUED, 0)

    response = post_action(operator, "cancel_jobs", [queued, claimed])
    assert messages_of(response)[0] == "Cancelled 1 queued job(s)."
    assert "Asked the workers running 1 job(s) to stop them" in messages_of(response)[1]
    claimed.refresh_from_db()
    assert claimed.cancel_requested and claimed.status == S.CLAIMED

    later = timezone.now() + timedelta(hours=1)
    Job.objects.filter(pk=failed.pk).update(run_after=later)
    post_action(operator, "run_jobs_now", [failed])
    failed.refresh_from_db()
    assert failed.run_after <= timezone.now()


def test_delete_asks_first_and_keeps_running_jobs(operator: Client) -> None:
    done, claimed = make(S.DONE), make(S.CLAIMED, owner="w1")
    response = post_action(operator, "delete_jobs", [done, claimed])
    assert b"Delete 2 selected job(s)?" in response.content
    assert Job.objects.count() == 2
    response = post_action(operator, "delete_jobs", [done, claimed], post="yes")
    assert messages_of(response)[0] == "Deleted 1 job(s)."
    assert list(Job.objects.all()) == [claimed]


def test_select_across_applies_to_everything_matching_the_filter(
    operator: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chunked, "CHUNK_SIZE", 7)  # several chunks
    failed_emails = [make(S.FAILED, queue="emails") for _ in range(30)]
    failed_default = make(S.FAILED, queue="default")
    done_emails = make(S.DONE, queue="emails")
    response = post_action(
        operator,
        "requeue_jobs",
        failed_emails[:1],  # the page's checkboxes: one is enough with select_across
        query="?queue=emails&status__exact=failed",
        select_across="1",
    )
    assert messages_of(response) == ["Requeued 30 job(s)."]
    assert Job.objects.filter(queue="emails", status=S.QUEUED).count() == 30
    assert failed_default.refresh_status() == S.FAILED
    assert done_emails.refresh_status() == S.DONE


# -- permissions and CSRF --------------------------------------------------------------


def test_view_only_staff_can_look_but_not_act(viewer: Client) -> None:
    job = make(S.FAILED, last_error="boom")
    page = viewer.get(reverse(CHANGELIST)).content.decode()
    assert 'name="action"' not in page
    for action in ("requeue_jobs", "cancel_jobs", "run_jobs_now", "delete_jobs"):
        assert post_action(viewer, action, [job]).status_code == 403
    operate = reverse("admin:django_dbqueue_job_operate", args=[job.pk])
    assert viewer.post(operate, {"operation": "requeue"}).status_code == 403
    change = reverse("admin:django_dbqueue_job_change", args=[job.pk])
    assert viewer.post(change, {"status": "queued"}).status_code == 403
    dashboard = viewer.get(reverse(DASHBOARD))
    assert dashboard.status_code == 200
    assert b'name="operation"' not in dashboard.content
    assert job.refresh_status() == S.FAILED


def test_change_permission_without_delete_gets_no_delete_action() -> None:
    client = login(staff("changer", "view_job", "change_job"))
    job = make(S.DONE)
    page = client.get(reverse(CHANGELIST)).content.decode()
    assert 'value="requeue_jobs"' in page and 'value="delete_jobs"' not in page
    assert post_action(client, "delete_jobs", [job], post="yes").status_code == 403
    assert Job.objects.filter(pk=job.pk).exists()


def test_staff_without_job_permissions_see_nothing() -> None:
    client = login(staff("nobody"))
    assert client.get(reverse(CHANGELIST)).status_code == 403
    assert client.get(reverse(DASHBOARD)).status_code == 403


def test_csrf_is_enforced() -> None:
    user = staff("csrf", "view_job", "change_job")
    client = login(user, enforce_csrf_checks=True)
    job = make(S.FAILED)
    operate = reverse("admin:django_dbqueue_job_operate", args=[job.pk])
    assert client.post(operate, {"operation": "requeue"}).status_code == 403
    assert post_action(client, "requeue_jobs", [job]).status_code == 403
    assert job.refresh_status() == S.FAILED
    page = client.get(reverse(DASHBOARD)).content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert token, "the dashboard's requeue form carries a CSRF token"
    response = client.post(operate, {"operation": "requeue", "csrfmiddlewaretoken": token.group(1)})
    assert response.status_code == 302
    assert job.refresh_status() == S.QUEUED


def test_operate_refuses_clearly(operator: Client) -> None:
    done, claimed = make(S.DONE), make(S.CLAIMED, owner="w1")
    operate = reverse("admin:django_dbqueue_job_operate", args=[done.pk])
    response = operator.post(operate, {"operation": "cancel"}, follow=True)
    assert messages_of(response) == [
        f"Job #{done.pk} was not cancelled: it is done, already finished."
    ]
    response = operator.post(operate, {"operation": "run_now"}, follow=True)
    assert messages_of(response) == [f"Job #{done.pk} is done: only queued jobs can be run now."]
    operate = reverse("admin:django_dbqueue_job_operate", args=[claimed.pk])
    response = operator.post(
        operate, {"operation": "cancel", "next": "https://evil.example/"}, follow=False
    )
    assert response["Location"] == reverse("admin:django_dbqueue_job_change", args=[claimed.pk])
    response = operator.post(operate, {"operation": "requeue"}, follow=True)
    assert "only failed, cancelled or done jobs can be requeued" in messages_of(response)[-1]
    assert operator.get(operate).status_code == 405


# -- dashboard -------------------------------------------------------------------------


def test_dashboard_shows_counts_throughput_workers_and_failures(operator: Client) -> None:
    now = timezone.now()
    for minutes_ago in (1, 1, 5):
        make(S.DONE, finished_at=now - timedelta(minutes=minutes_ago))
    make(S.DONE, finished_at=now - timedelta(hours=3))  # outside the chart
    failure = make(
        S.FAILED, queue="emails", finished_at=now, last_error=f"Traceback\nKeyError: {XSS}"
    )
    old = make(S.QUEUED, queue="reports", run_after=now - timedelta(minutes=30))
    make(S.QUEUED, queue="reports", run_after=now + timedelta(hours=1))  # not waiting yet
    WorkerProcess.objects.create(
        name="a:1:x", host="host-a", pid=1, queues=["default"], heartbeat_at=now
    )
    WorkerProcess.objects.create(
        name="b:2:y", host="host-b", pid=2, queues=["emails"], heartbeat_at=now - timedelta(hours=1)
    )
    response = operator.get(reverse(DASHBOARD))
    assert response.status_code == 200
    page = response.content.decode()
    rows = {row.queue: row for row in response.context["queues"]}
    assert dict((s, c) for s, c, _ in rows["default"].counts)["done"] == 4
    assert dict((s, c) for s, c, _ in rows["reports"].counts)["queued"] == 2
    assert rows["reports"].oldest_id == old.pk
    assert rows["reports"].oldest_label == "30 min"
    assert rows["default"].oldest_id is None
    chart = response.context["chart"]
    assert (chart.total_done, chart.total_failed) == (3, 1)
    assert chart.peak == 2
    assert len(chart.bars) == 60
    assert "Last hour: 3 done, 1 failed" in page
    assert page.count("<rect ") == 3
    assert "host-a" in page and "host-b" in page
    assert page.count('class="dbq-alive"') == 1 and page.count('class="dbq-dead"') == 1
    assert f"#{failure.pk}" in page
    assert "<script>alert" not in page and "KeyError: &lt;script&gt;" in page
    assert f'action="{reverse("admin:django_dbqueue_job_operate", args=[failure.pk])}"' in page


def test_dashboard_requeue_button_requeues_and_comes_back(operator: Client) -> None:
    failure = make(S.FAILED, finished_at=timezone.now(), attempts=3)
    operate = reverse("admin:django_dbqueue_job_operate", args=[failure.pk])
    response = operator.post(
        operate, {"operation": "requeue_now", "next": reverse(DASHBOARD)}, follow=False
    )
    assert response["Location"] == reverse(DASHBOARD)
    failure.refresh_from_db()
    assert (failure.status, failure.attempts) == (S.QUEUED, 0)


def test_worker_list_is_read_only_and_shows_liveness(operator: Client) -> None:
    now = timezone.now()
    WorkerProcess.objects.create(
        name="a:1:x", host="host-a", pid=1, queues=["default"], heartbeat_at=now
    )
    WorkerProcess.objects.create(
        name="b:2:y", host="host-b", pid=2, queues=["emails"], heartbeat_at=now - timedelta(hours=1)
    )
    user = User.objects.get(username="operator")
    user.user_permissions.add(*Permission.objects.filter(codename__in=["view_workerprocess"]))
    page = operator.get(reverse("admin:django_dbqueue_workerprocess_changelist")).content.decode()
    assert page.count('alt="True"') == 1 and page.count('alt="False"') >= 1
    assert "host-a" in page and "host-b" in page
    assert (
        'name="_save"'
        not in operator.get(
            reverse(
                "admin:django_dbqueue_workerprocess_change",
                args=[WorkerProcess.objects.get(pid=1).pk],
            )
        ).content.decode()
    )
