"""Keys and queue names compare exactly on every database (issue #25, item 4).

MySQL/MariaDB compare by the column's collation; their default ones ignore case, accents
and trailing spaces. Migration 0010 makes those columns binary and NO PAD there; these
tests run on all three databases.
"""

from __future__ import annotations

import pytest
from django.conf import settings
from django.test import override_settings

from django_dbqueue import enqueue
from django_dbqueue.models import ConcurrencyKey, Job
from django_dbqueue.queue import pausing
from tests.support import jobs

pytestmark = pytest.mark.django_db

VARIANTS = ["export:Bob", "export:bob", "export:BOB", "export:Bob ", "export:Böb", "export:Bo"]


def test_unique_keys_differing_in_case_accents_or_trailing_spaces_are_different_keys() -> None:
    created = [enqueue(jobs.noop, unique_key=key) for key in VARIANTS]
    assert len({job.pk for job in created}) == len(VARIANTS)
    again = [enqueue(jobs.noop, unique_key=key) for key in VARIANTS]
    assert [job.pk for job in again] == [job.pk for job in created]
    assert Job.objects.count() == len(VARIANTS)
    assert sorted(Job.objects.values_list("unique_key", flat=True)) == sorted(VARIANTS)
    assert Job.objects.get(unique_key="export:bob").pk == created[1].pk


def test_concurrency_keys_differing_in_case_accents_or_spaces_have_limits_of_their_own() -> None:
    for key in VARIANTS:
        enqueue(jobs.noop, concurrency_key=key, concurrency_limit=1)
        enqueue(jobs.noop, concurrency_key=key, concurrency_limit=1)

    claimed = Job.objects.claim("w1", 100)

    assert sorted(job.concurrency_key or "" for job in claimed) == sorted(VARIANTS)
    assert ConcurrencyKey.objects.count() == len(VARIANTS)
    assert sorted(ConcurrencyKey.objects.values_list("key", flat=True)) == sorted(VARIANTS)


QUEUES = ["reports", "Reports", "REPORTS", "reports ", "réports"]


def test_queue_names_differing_in_case_accents_or_spaces_are_different_queues() -> None:
    with override_settings(DBQUEUE={**settings.DBQUEUE, "QUEUES": QUEUES}):
        for queue in QUEUES:
            enqueue(jobs.noop, queue=queue)
        assert Job.objects.filter(queue="reports").count() == 1
        assert pausing.pause("reports")
        assert pausing.paused_queues() == {"reports"}
        assert pausing.pause("Reports"), "a queue of its own, not paused yet"
        claimed = Job.objects.claim("w1", 100, queues=["REPORTS"])
        assert [job.queue for job in claimed] == ["REPORTS"]
