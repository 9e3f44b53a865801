"""The admin under issue 13's attacks: payloads hidden from view-only staff, crafted
requests answered without a 500, an unknown filter value never widening a selection,
and the dashboard's query count independent of the number of queues."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_dbqueue.models import Job
from django_dbqueue.queue import counts
from tests.admin.test_jobs import CHANGELIST, DASHBOARD, login, make, post_action, staff

pytestmark = pytest.mark.django_db

S = Job.Status
SECRET_ARG = "card-4111-1111-1111-1111"
SECRET_KWARG = "reset-token-s3cr3t"
SECRET_RESULT = "db-password-hunter2"


@pytest.fixture
def payload_job() -> Job:
    return make(
        S.FAILED,
        args=[SECRET_ARG],
        kwargs={"token": SECRET_KWARG},
        result={"PASSWORD": SECRET_RESULT},
        last_error="Traceback (most recent call last):\nValueError: visible traceback",
    )


def change_page(client: Client, job: Job) -> str:
    response = client.get(reverse("admin:django_dbqueue_job_change", args=[job.pk]))
    assert response.status_code == 200
    return str(response.content.decode())


def shows_payload(page: str) -> bool:
    return any(secret in page for secret in (SECRET_ARG, SECRET_KWARG, SECRET_RESULT))


# -- item 2: payloads ----------------------------------------------------------------------


def test_view_only_staff_do_not_see_args_kwargs_or_result(payload_job: Job) -> None:
    page = change_page(login(staff("viewer", "view_job")), payload_job)
    assert not shows_payload(page)
    assert "Hidden: they may hold personal data or secrets" in page
    assert "ValueError: visible traceback" in page, "tracebacks stay visible"


def test_staff_who_may_change_jobs_see_the_payload(payload_job: Job) -> None:
    page = change_page(login(staff("changer", "view_job", "change_job")), payload_job)
    assert SECRET_ARG in page and SECRET_KWARG in page and SECRET_RESULT in page


def test_the_setting_can_show_payloads_to_view_only_staff(payload_job: Job, settings: Any) -> None:
    settings.DBQUEUE = {**settings.DBQUEUE, "ADMIN_SHOW_PAYLOADS": "view"}
    page = change_page(login(staff("viewer", "view_job")), payload_job)
    assert SECRET_ARG in page and SECRET_RESULT in page


def test_the_setting_can_hide_payloads_from_everyone(payload_job: Job, settings: Any) -> None:
    settings.DBQUEUE = {**settings.DBQUEUE, "ADMIN_SHOW_PAYLOADS": "none"}
    superuser = User.objects.create_superuser("root", password="pw")
    page = change_page(login(superuser), payload_job)
    assert not shows_payload(page)
    assert "ValueError: visible traceback" in page


def test_view_only_staff_cannot_find_jobs_by_searching_a_secret(payload_job: Job) -> None:
    viewer = login(staff("viewer", "view_job"))
    found = viewer.get(reverse(CHANGELIST), {"q": SECRET_ARG})
    assert found.status_code == 200
    assert payload_job.pk not in [j.pk for j in found.context["cl"].result_list]
    assert not shows_payload(viewer.get(reverse(CHANGELIST)).content.decode())


@pytest.mark.parametrize(
    "lookup",
    ["result__PASSWORD__startswith", "args__0", "args__contains", "kwargs__token", "result"],
)
def test_view_only_staff_cannot_guess_a_payload_through_url_lookups(
    payload_job: Job, lookup: str
) -> None:
    # Django's admin accepts any lookup on the model's own fields from the URL: one
    # guess at a time, ?result__PASSWORD__startswith=d would spell the secret out.
    viewer = login(staff("viewer", "view_job"))
    assert viewer.get(reverse(CHANGELIST), {lookup: "d"}).status_code == 400


def test_staff_who_see_payloads_may_filter_by_them(payload_job: Job) -> None:
    changer = login(staff("changer", "view_job", "change_job"))
    response = changer.get(reverse(CHANGELIST), {"result__PASSWORD__startswith": "db-"})
    assert [j.pk for j in response.context["cl"].result_list] == [payload_job.pk]


# -- item 5: crafted requests --------------------------------------------------------------


def test_search_for_superscript_two_is_not_a_500(operator: Client) -> None:
    make(S.FAILED, last_error="ValueError: ²")
    response = operator.get(reverse(CHANGELIST), {"q": "²"})
    assert response.status_code == 200
    assert len(response.context["cl"].result_list) == 1, "a text search, not an id"


def test_search_for_a_5000_digit_number_is_not_a_500(operator: Client) -> None:
    make(S.FAILED)
    response = operator.get(reverse(CHANGELIST), {"q": "9" * 5000})
    assert response.status_code == 200
    assert list(response.context["cl"].result_list) == []


def test_search_for_a_number_past_bigint_is_not_a_500(operator: Client) -> None:
    response = operator.get(reverse(CHANGELIST), {"q": str(2**63)})
    assert response.status_code == 200


def test_search_by_id_still_finds_the_job(operator: Client) -> None:
    job = make(S.FAILED)
    response = operator.get(reverse(CHANGELIST), {"q": f"#{job.pk}"})
    assert [j.pk for j in response.context["cl"].result_list] == [job.pk]


def test_operate_with_superscript_two_is_a_404(operator: Client) -> None:
    url = reverse("admin:django_dbqueue_job_operate", args=["²"])
    assert operator.post(url, {"operation": "requeue"}).status_code == 404


def test_operate_with_5000_digits_is_a_404(operator: Client) -> None:
    url = reverse("admin:django_dbqueue_job_operate", args=["9" * 5000])
    assert operator.post(url, {"operation": "requeue"}).status_code == 404


def test_change_page_with_crafted_ids_is_not_a_500(operator: Client) -> None:
    for object_id in ("²", "9" * 5000, str(2**63)):
        url = reverse("admin:django_dbqueue_job_change", args=[object_id])
        assert operator.get(url).status_code in (302, 404)


def test_queue_filter_with_a_nul_is_refused_not_a_500(operator: Client) -> None:
    make(S.FAILED)
    assert operator.get(reverse(CHANGELIST), {"queue": "a\x00"}).status_code == 400


def test_task_filter_with_a_nul_is_refused_not_a_500(operator: Client) -> None:
    make(S.FAILED)
    assert operator.get(reverse(CHANGELIST), {"task": "a\x00"}).status_code == 400


def test_status_filter_with_a_nul_is_refused_not_a_500(operator: Client) -> None:
    assert operator.get(reverse(CHANGELIST), {"status__exact": "a\x00"}).status_code == 400


def test_search_with_a_nul_is_refused_not_a_500(operator: Client) -> None:
    assert operator.get(reverse(CHANGELIST), {"q": "a\x00"}).status_code == 400


def test_an_action_posted_with_a_nul_filter_changes_nothing(operator: Client) -> None:
    job = make(S.FAILED)
    response = post_action(
        operator, "delete_jobs", [job], query="?queue=a%00", select_across="1", post="yes"
    )
    assert response.status_code == 400
    assert Job.objects.filter(pk=job.pk).exists()


@pytest.mark.parametrize(
    "query",
    [
        {"p": "²"},
        {"p": "9" * 5000},
        {"o": "²"},
        {"o": "9" * 5000},
        {"status__exact": "²"},
        {"queue": "²" * 100},
        {"task": "x" * 5000},
        {"_to_field": "args"},
        {"e": "²"},
    ],
    ids=lambda query: next(iter(query)),
)
def test_other_crafted_list_parameters_are_not_a_500(
    operator: Client, query: dict[str, str]
) -> None:
    make(S.FAILED)
    response = operator.get(reverse(CHANGELIST), query)
    assert response.status_code < 500


def test_unknown_failed_since_value_matches_nothing(operator: Client) -> None:
    make(S.FAILED, finished_at=timezone.now())
    make(S.DONE)
    response = operator.get(reverse(CHANGELIST), {"failed_since": "99y"})
    assert response.status_code == 200
    assert list(response.context["cl"].result_list) == []


def test_select_all_and_delete_under_an_unknown_failed_since_deletes_nothing(
    operator: Client,
) -> None:
    jobs = [make(S.FAILED, finished_at=timezone.now()) for _ in range(3)] + [make(S.DONE)]
    response = post_action(
        operator,
        "delete_jobs",
        jobs[:1],
        query="?failed_since=99y",
        select_across="1",
        post="yes",
    )
    assert response.status_code == 200
    assert Job.objects.count() == 4


def test_known_failed_since_value_still_filters(operator: Client) -> None:
    recent = make(S.FAILED, finished_at=timezone.now())
    make(S.FAILED, finished_at=timezone.now() - timedelta(days=2))
    response = operator.get(reverse(CHANGELIST), {"failed_since": "24h"})
    assert [j.pk for j in response.context["cl"].result_list] == [recent.pk]


# -- item 6: the dashboard with many queues ------------------------------------------------


def many_queues(settings: Any, count: int) -> list[str]:
    queues = [f"queue-{i:04d}" for i in range(count)]
    settings.DBQUEUE = {**settings.DBQUEUE, "QUEUES": ["default", *queues]}
    return queues


def test_dashboard_with_400_queues_takes_a_bounded_number_of_queries(
    operator: Client, settings: Any
) -> None:
    queues = many_queues(settings, 400)
    now = timezone.now()
    waiting = make(S.QUEUED, queue=queues[350], run_after=now - timedelta(minutes=5))
    make(S.QUEUED, queue=queues[350], run_after=now - timedelta(minutes=1))
    make(S.FAILED, queue=queues[399], finished_at=now)
    with CaptureQueriesContext(connection) as queries:
        response = operator.get(reverse(DASHBOARD))
    assert response.status_code == 200
    # 401 queues x 5 statuses: 21 statements of UNION ALL at most (1 on PostgreSQL),
    # 5 for the oldest waiting job, plus the page's own fixed queries.
    assert len(queries) < 50, len(queries)
    rows = {row.queue: row for row in response.context["queues"]}
    assert dict((s, c) for s, c, _ in rows[queues[350]].counts)["queued"] == 2
    assert dict((s, c) for s, c, _ in rows[queues[399]].counts)["failed"] == 1
    assert rows[queues[350]].oldest_id == waiting.pk
    assert rows[queues[350]].oldest_label == "5 min"
    assert rows[queues[0]].oldest_id is None


def test_capped_counts_stop_at_the_limit_in_every_chunk(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(counts, "BRANCHES_PER_STATEMENT", 3)
    queues = many_queues(settings, 4)
    for _ in range(5):
        make(S.QUEUED, queue=queues[3])
    make(S.DONE, queue=queues[0])
    found = counts.capped_counts(Job, "default", queues, ["queued", "done"], limit=3)
    assert found[(queues[3], "queued")] == 4, "limit + 1: more than the limit"
    assert found[(queues[0], "done")] == 1
    assert found[(queues[1], "queued")] == 0
