"""The admin's schedule page, enqueue now, pausing queues and the table's size."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_dbqueue.models import Job, QueueState, ScheduleTick
from django_dbqueue.queue import pausing
from tests.admin.test_jobs import CHANGELIST, DASHBOARD, XSS, login, make, messages_of, staff

pytestmark = pytest.mark.django_db

SCHEDULES = "admin:django_dbqueue_job_schedules"
ENQUEUE = "admin:django_dbqueue_job_schedule_enqueue"
SWITCH = "admin:django_dbqueue_job_queue_switch"


@pytest.fixture
def operator() -> Client:
    return login(staff("operator", "view_job", "change_job"))


@pytest.fixture
def viewer() -> Client:
    return login(staff("viewer", "view_job"))


@pytest.fixture(autouse=True)
def schedule(settings: object) -> None:
    settings.DBQUEUE = {  # type: ignore[attr-defined]
        **settings.DBQUEUE,  # type: ignore[attr-defined]
        "SCHEDULE": {
            "nightly": {"task": "tests.support.jobs.noop", "cron": "0 3 * * *"},
            "often": {"task": "tests.support.jobs.add", "every": 60, "args": [1, XSS]},
        },
    }


def test_schedules_page_lists_last_and_next_tick_and_last_job(viewer: Client) -> None:
    job = make("done", task="tests.support.jobs.noop")
    tick = timezone.now().replace(hour=3, minute=0, second=0, microsecond=0) - timedelta(days=1)
    ScheduleTick.objects.create(schedule="nightly", tick_at=tick, job_id=job.pk)
    page = viewer.get(reverse(SCHEDULES)).content.decode()
    assert "nightly" in page and "cron 0 3 * * * (UTC)" in page
    assert tick.strftime("%Y-%m-%d %H:%M:%S") in page
    assert f"#{job.pk}</a>" in page and "dbq-done" in page
    assert "every 60 s" in page and "never" in page
    assert "Enqueue now" not in page  # view-only users get no button


def test_enqueue_now_needs_change_permission_and_a_post(viewer: Client, operator: Client) -> None:
    assert viewer.post(reverse(ENQUEUE), {"schedule": "nightly"}).status_code == 403
    assert operator.get(reverse(ENQUEUE)).status_code == 405
    assert not Job.objects.exists()


def test_enqueue_now_enqueues_the_schedules_job_and_records_it(operator: Client) -> None:
    response = operator.post(reverse(ENQUEUE), {"schedule": "often"}, follow=True)
    job = Job.objects.get()
    assert (job.task, job.args) == ("tests.support.jobs.add", [1, XSS])
    assert messages_of(response) == [f"Schedule 'often': job #{job.pk} enqueued."]
    assert ScheduleTick.objects.get(schedule="often").job_id == job.pk
    assert XSS not in response.content.decode()


def test_enqueue_now_of_an_unknown_schedule_is_404(operator: Client) -> None:
    assert operator.post(reverse(ENQUEUE), {"schedule": "nope"}).status_code == 404


def test_csrf_is_enforced_on_the_new_forms() -> None:
    client = login(staff("operator", "view_job", "change_job"), enforce_csrf_checks=True)
    assert client.post(reverse(ENQUEUE), {"schedule": "often"}).status_code == 403
    assert (
        client.post(reverse(SWITCH), {"queue": "emails", "operation": "pause"}).status_code == 403
    )
    assert not QueueState.objects.exists()


def test_dashboard_pauses_and_resumes_a_queue(operator: Client, viewer: Client) -> None:
    page = operator.get(reverse(DASHBOARD)).content.decode()
    assert 'name="operation" value="pause"' in page
    assert (
        viewer.post(reverse(SWITCH), {"queue": "emails", "operation": "pause"}).status_code == 403
    )
    response = operator.post(
        reverse(SWITCH), {"queue": "emails", "operation": "pause"}, follow=True
    )
    assert messages_of(response) == ["Queue 'emails' is now paused."]
    assert pausing.paused_queues() == {"emails"}
    assert "paused</span>" in response.content.decode()
    operator.post(reverse(SWITCH), {"queue": "emails", "operation": "resume"})
    assert pausing.paused_queues() == set()


@pytest.mark.parametrize(
    "data", [{"queue": "nope", "operation": "pause"}, {"queue": "emails", "operation": "drop"}]
)
def test_unknown_queue_or_operation_is_404(operator: Client, data: dict[str, str]) -> None:
    assert operator.post(reverse(SWITCH), data).status_code == 404
    assert not QueueState.objects.exists()


def test_changelist_actions_pause_and_resume_the_selected_jobs_queues(operator: Client) -> None:
    jobs = [make(queue="emails"), make(queue="reports"), make(queue="emails")]
    data = {"action": "pause_queues", "index": "0", "_selected_action": [j.pk for j in jobs]}
    response = operator.post(reverse(CHANGELIST), data, follow=True)
    assert messages_of(response) == ["Paused queue(s): emails, reports."]
    assert pausing.paused_queues() == {"emails", "reports"}
    data["action"] = "resume_queues"
    operator.post(reverse(CHANGELIST), data)
    assert pausing.paused_queues() == set()


def test_dashboard_shows_the_oldest_finished_job(viewer: Client) -> None:
    old = timezone.now() - timedelta(days=3)
    make("failed", finished_at=old)
    make("done", finished_at=timezone.now())
    page = viewer.get(reverse(DASHBOARD)).content.decode()
    assert f"oldest finished job: {old.strftime('%Y-%m-%d %H:%M:%S')} UTC" in page
