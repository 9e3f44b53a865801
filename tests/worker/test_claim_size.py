"""A worker claims about CLAIM_AHEAD seconds of work: one job before it knows what jobs
cost, a whole batch of fast jobs, one at a time of slow ones."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.test import override_settings

from django_dbqueue import enqueue_many
from django_dbqueue.worker.loop import Worker
from tests.support import jobs

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_new_worker_claims_one_job() -> None:
    assert Worker(handle_signals=False, batch_size=50).claim_size() == 1


def test_fast_jobs_are_claimed_a_whole_batch_at_a_time() -> None:
    # "Fast" next to CLAIM_AHEAD: a minute ahead, a no-op job that took even a second on
    # a loaded machine (0.15 s ahead: 3 ms, which a busy CI runner exceeds) fills a batch.
    enqueue_many({"task": jobs.noop} for _ in range(5))
    with override_settings(DBQUEUE={**settings.DBQUEUE, "CLAIM_AHEAD": 60}):
        worker = Worker(burst=True, handle_signals=False, batch_size=50)
        worker.run()
    assert worker.stats.done == 5
    assert worker.claim_size() == 50


def test_slow_jobs_are_claimed_one_at_a_time() -> None:
    enqueue_many({"task": jobs.sleep, "args": [0.3]} for _ in range(2))
    worker = Worker(burst=True, handle_signals=False, batch_size=50)
    worker.run()
    assert worker.stats.done == 2
    assert worker.claim_size() == 1


def test_jobs_of_a_few_milliseconds_are_claimed_a_few_at_a_time() -> None:
    enqueue_many({"task": jobs.sleep, "args": [0.02]} for _ in range(10))
    worker = Worker(burst=True, handle_signals=False, batch_size=50)
    worker.run()
    assert worker.stats.done == 10
    # 0.15 s of 20 ms jobs: 7; the job's own overhead and a loaded machine make it fewer.
    assert 2 <= worker.claim_size() <= 7
