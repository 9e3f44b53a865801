"""The admin shows batches with their progress, and WAITING jobs as such."""

from __future__ import annotations

import pytest
from django.urls import reverse

from django_dbqueue import enqueue, enqueue_batch
from django_dbqueue.models import Job
from django_dbqueue.worker.loop import Worker
from tests.admin.test_jobs import CHANGELIST, login, staff
from tests.support import flow_jobs

pytestmark = pytest.mark.django_db(transaction=True)

BATCHES = reverse("admin:django_dbqueue_batch_changelist")


def test_the_batch_page_shows_progress_to_job_viewers_only() -> None:
    batch = enqueue_batch([{"task": flow_jobs.value, "args": [n]} for n in range(4)])
    Worker(burst=True, handle_signals=False, max_jobs=2).run()
    page = login(staff("viewer", "view_job")).get(BATCHES)
    assert page.status_code == 200
    assert "2 of 4 (50%)" in page.content.decode()
    assert str(batch.pk) in page.content.decode()
    assert login(staff("nobody")).get(BATCHES).status_code == 403


def test_waiting_jobs_are_listed_and_filtered_as_waiting() -> None:
    first = enqueue(flow_jobs.value, [1])
    enqueue(flow_jobs.value, [2], depends_on=[first])
    page = login(staff("viewer2", "view_job")).get(reverse(CHANGELIST) + "?status__exact=waiting")
    assert page.status_code == 200
    assert "Waiting" in page.content.decode()
    assert Job.objects.filter(status=Job.Status.WAITING).count() == 1
