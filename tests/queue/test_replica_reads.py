"""A project's router may send reads elsewhere (a replica): a job read from the primary
re-reads from there, its deferred fields and ``refresh_status()`` included. The real
lagging replica is in tests/replica/; this runs on every database."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

from django_dbqueue import enqueue
from django_dbqueue.models import Job
from tests.support import jobs

pytestmark = pytest.mark.django_db(transaction=True)


class ReadsNowhere:
    """Every read to an alias that does not exist: a read that follows it raises."""

    def db_for_read(self, model: Any, **hints: Any) -> str:
        return "nowhere"


def test_a_job_re_reads_from_the_database_it_was_read_from() -> None:
    job = enqueue(jobs.add, [1, 2])
    with override_settings(DATABASE_ROUTERS=[f"{__name__}.ReadsNowhere"]):
        loaded = Job.objects.primary().only("id").get(pk=job.pk)
        assert loaded.task == "tests.support.jobs.add"  # a deferred field
        assert loaded.args == [1, 2]
        assert loaded.refresh_status() == Job.Status.QUEUED
        loaded.refresh_from_db()
        assert loaded._state.db == "default"
