"""Operator actions work on Job.objects as on any queryset of jobs."""

from __future__ import annotations

import pytest

from django_dbqueue import enqueue
from django_dbqueue.models import Job
from tests.support import jobs

pytestmark = pytest.mark.django_db(transaction=True)


def test_manager_has_the_querysets_operator_actions() -> None:
    failed = enqueue(jobs.add, args=[1, 2])
    waiting = enqueue(jobs.add, args=[3, 4])
    Job.objects.filter(pk=failed.pk).update(status=Job.Status.FAILED, attempts=3)

    assert Job.objects.requeue() == 1
    assert Job.objects.run_now() == 2
    assert Job.objects.cancel() == (2, 0)
    assert set(Job.objects.values_list("status", flat=True)) == {Job.Status.CANCELLED}
    assert Job.objects.delete_unclaimed() == 2
    assert not Job.objects.filter(pk__in=[failed.pk, waiting.pk]).exists()
