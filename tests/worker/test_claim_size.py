"""A worker claims about CLAIM_AHEAD seconds of work: one job before it knows what jobs
cost, a whole batch of fast jobs, one at a time of slow ones."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.test import override_settings

from django_dbqueue import enqueue_many
from django_dbqueue.models import Job
from django_dbqueue.worker.loop import Worker
from tests.support import jobs

pytestmark = pytest.mark.django_db(transaction=True)


def drained(claim_ahead: float) -> Worker:
    """A worker of batches of 50 that has run every job, with CLAIM_AHEAD ``claim_ahead``."""
    with override_settings(DBQUEUE={**settings.DBQUEUE, "CLAIM_AHEAD": claim_ahead}):
        worker = Worker(burst=True, handle_signals=False, batch_size=50)
        worker.run()
    return worker


def test_a_new_worker_claims_one_job() -> None:
    assert Worker(handle_signals=False, batch_size=50).claim_size() == 1


def test_fast_jobs_are_claimed_a_whole_batch_at_a_time() -> None:
    # "Fast" next to CLAIM_AHEAD: a minute ahead, a no-op job that took even a second on
    # a loaded machine (0.15 s ahead: 3 ms, which a busy CI runner exceeds) fills a batch.
    enqueue_many({"task": jobs.noop} for _ in range(5))
    worker = drained(claim_ahead=60)
    assert worker.stats.done == 5
    assert worker.claim_size() == 50


def test_a_workers_first_job_each_lane_is_not_averaged() -> None:
    """A new process's first job pays for its warm-up (25 to 90 ms for a no-op among 48
    children starting at once): averaged in, it kept the claims small for seconds."""
    enqueue_many([{"task": jobs.sleep, "args": [0.3], "priority": 9}])
    enqueue_many({"task": jobs.noop} for _ in range(5))
    worker = drained(claim_ahead=6)
    assert worker.stats.done == 6
    # 5 no-ops of under 0.12 s each: a whole batch of 6 s (the 0.3 s job averaged in
    # would make it 39).
    assert worker.claim_size() == 50
    threaded = Worker(handle_signals=False, batch_size=50, threads=2)
    for seconds in (5.0, 4.0):  # one a lane
        threaded.recorder.note_time(seconds)
    assert threaded.recorder.job_seconds is None
    threaded.recorder.note_time(0.5)
    assert threaded.recorder.job_seconds == 0.5


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


def threaded_worker_holding(waiting: int, job_seconds: float) -> Worker:
    """A 4-thread worker whose executor (not started) holds ``waiting`` jobs, and whose
    jobs took ``job_seconds`` each."""
    worker = Worker(handle_signals=False, batch_size=50, threads=4)
    worker.recorder.job_seconds = job_seconds
    worker.executor.submit([Job(id=n, task="t") for n in range(waiting)])
    assert worker.executor.waiting() == waiting
    return worker


def test_threads_claim_again_before_the_waiting_jobs_run_out() -> None:
    # 1 ms jobs: 4 lanes start 600 within CLAIM_AHEAD (0.15 s); 30 wait.
    worker = threaded_worker_holding(30, 0.001)
    assert worker._wanted() == 0, "enough to keep every lane going, and no claim measured"
    worker._outlast = 40  # claims saw 40 jobs start while they were out
    assert worker._wanted() == 50, "a whole batch, before the 30 run out"
    worker._outlast = 29
    assert worker._wanted() == 0


def test_slow_jobs_are_not_claimed_ahead_whatever_a_claim_took() -> None:
    # 1 s jobs: the 4 lanes start 4 within CLAIM_AHEAD, and 4 wait already.
    worker = threaded_worker_holding(4, 1.0)
    worker._outlast = 50
    assert worker._wanted() == 0
    worker = threaded_worker_holding(1, 1.0)
    worker._outlast = 50
    assert worker._wanted() == 3


def test_the_jobs_a_claim_must_outlast_are_measured() -> None:
    worker = Worker(handle_signals=False, batch_size=50, threads=4)
    worker._note_claim(waiting=0, started=0, fed=False)
    assert worker._outlast == 0, "idle lanes say nothing"
    # The last claim brought jobs and none were left when this one went out: too late.
    worker._note_claim(waiting=0, started=0, fed=True)
    assert worker._outlast == 4
    worker._note_claim(waiting=3, started=3, fed=True)  # ran dry during the claim
    assert worker._outlast == 8
    for _ in range(5):
        worker._note_claim(waiting=8, started=8, fed=True)
    assert worker._outlast == 50, "at most a batch"
    worker._note_claim(waiting=50, started=10, fed=True)  # in time: it decays slowly
    assert worker._outlast == 45
    worker._note_claim(waiting=45, started=44, fed=True)
    assert worker._outlast == 44
