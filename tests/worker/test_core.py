"""One worker core for both executors: the same jobs come to the same record, counts and
slot, whether they run in the main thread (threads=1) or in threads (threads=3)."""

from __future__ import annotations

import pytest

from django_dbqueue import enqueue, enqueue_many
from django_dbqueue.models import Job
from django_dbqueue.worker.executors.inline import InlineExecutor
from django_dbqueue.worker.executors.threads import ThreadedExecutor
from django_dbqueue.worker.loop import Worker, make_worker
from tests.support import jobs

pytestmark = pytest.mark.django_db(transaction=True)
S = Job.Status


@pytest.mark.parametrize("threads", [1, 3])
def test_every_outcome_is_recorded_once_and_frees_its_held_entry(threads: int) -> None:
    done = enqueue_many({"task": jobs.add, "args": [n, 1]} for n in range(7))
    failed = enqueue(jobs.fail, max_attempts=1)
    retried = enqueue(jobs.fail, max_attempts=2, retry_backoff=3600)
    deferred = enqueue(jobs.retry_once, ["deferred"])
    worker = Worker(burst=True, handle_signals=False, batch_size=4, threads=threads)

    stats = worker.run()

    assert (stats.done, stats.failed, stats.retried) == (7, 1, 1)
    assert sorted(Job.objects.get(pk=j.pk).result for j in done) == list(range(1, 8))
    assert Job.objects.get(pk=failed.pk).status == S.FAILED
    assert (Job.objects.get(pk=retried.pk).status, Job.objects.get(pk=retried.pk).attempts) == (
        S.QUEUED,
        1,
    )
    assert Job.objects.get(pk=deferred.pk).status == S.QUEUED, "asked to run again later"
    assert not Job.objects.filter(status=S.CLAIMED).exists()
    assert worker.slot.held() == [], "no lease is renewed for a recorded job"
    assert worker.recorder.room() == worker.slot.capacity
    assert worker.slot.totals() == (7, 1, 1)


def test_make_worker_picks_the_executor_and_a_lane_per_thread() -> None:
    inline, threaded = make_worker(1, handle_signals=False), make_worker(4, handle_signals=False)
    assert isinstance(inline.executor, InlineExecutor) and inline.slot.lanes == 1
    assert isinstance(threaded.executor, ThreadedExecutor) and threaded.slot.lanes == 4
    # Before any job has run, the cost is unknown: a job for each lane.
    assert (inline.claim_size(), threaded.claim_size()) == (1, 4)
