"""enqueue_batch: the callbacks are enqueued exactly once when the last member ends,
with the counts; open batches grow until closed; requeued and deleted members."""

from __future__ import annotations

import pytest

from django_dbqueue import enqueue_batch
from django_dbqueue.exceptions import InvalidJob
from django_dbqueue.models import Batch, BatchCounter, Job
from django_dbqueue.queue import batches
from django_dbqueue.worker.loop import Worker
from django_dbqueue.workflows.batches import add_to_batch, close_batch
from django_dbqueue.workflows.sweep import Sweeper, repair
from tests.support import flow_jobs

pytestmark = pytest.mark.django_db(transaction=True)


def drain() -> None:
    Worker(burst=True, handle_signals=False).run()


ON_BATCH = "tests.support.flow_jobs.on_batch"


def callbacks(tag: str) -> list[Job]:
    return [job for job in Job.objects.filter(task=ON_BATCH) if job.args == [tag]]


def members(n: int, task: object = flow_jobs.value) -> list[dict[str, object]]:
    return [{"task": task, "args": [i]} for i in range(n)]


def spec(tag: str) -> dict[str, object]:
    return {"task": flow_jobs.on_batch, "args": [tag]}


def test_the_callbacks_run_once_with_the_counts() -> None:
    batch = enqueue_batch(
        [*members(5), {"task": flow_jobs.explode, "max_attempts": 1}],
        on_complete=spec("complete"),
        on_success=spec("success"),
        on_failure=spec("failure"),
    )
    drain()
    drain()  # the callbacks, enqueued by the last member's finish
    [complete] = callbacks("complete")
    [failure] = callbacks("failure")
    assert callbacks("success") == []
    counts = {"id": batch.pk, "total": 6, "done": 5, "failed": 1, "cancelled": 0}
    assert complete.result == {"tag": "complete", **counts}
    assert failure.status == Job.Status.DONE
    batch.refresh_from_db()
    assert (batch.done, batch.failed, batch.cancelled) == (5, 1, 0)
    assert sorted(batch.callback_ids) == sorted([complete.pk, failure.pk])
    # Looking again (as a second finisher or the sweep would) enqueues nothing.
    assert batches.complete("default", [batch.pk]) == []
    assert Job.objects.filter(task=ON_BATCH).count() == 2


def test_an_empty_batch_completes_at_once() -> None:
    batch = enqueue_batch([], on_success=spec("empty"))
    [callback] = callbacks("empty")
    assert callback.kwargs["batch"] == {
        "id": batch.pk,
        "total": 0,
        "done": 0,
        "failed": 0,
        "cancelled": 0,
    }


def test_an_open_batch_grows_until_closed_and_then_refuses_members() -> None:
    batch = enqueue_batch(members(2), on_complete=spec("grown"), close=False)
    drain()
    assert callbacks("grown") == []  # all ended, but the batch is open
    add_to_batch(batch, members(3))
    close_batch(batch)
    with pytest.raises(InvalidJob, match="closed"):
        add_to_batch(batch, members(1))
    assert Job.objects.filter(batch_id=batch.pk).count() == 5
    drain()
    [callback] = callbacks("grown")
    assert callback.kwargs["batch"]["done"] == 5


def test_a_member_requeued_after_completion_runs_again_but_is_not_counted_again() -> None:
    batch = enqueue_batch(members(2), on_complete=spec("again"))
    drain()
    first = Job.objects.filter(batch_id=batch.pk).first()
    assert first is not None
    assert Job.objects.filter(pk=first.pk).requeue() == 1
    drain()
    assert Job.objects.get(pk=first.pk).status == Job.Status.DONE
    assert len(callbacks("again")) == 1
    assert batches.totals("default", batch.pk) == {"done": 2, "failed": 0, "cancelled": 0}


def test_deleted_members_count_as_cancelled_and_pruned_ones_stay_counted() -> None:
    batch = enqueue_batch(members(4), on_complete=spec("pruned"))
    ids = list(Job.objects.filter(batch_id=batch.pk).order_by("id").values_list("id", flat=True))
    Job.objects.filter(pk=ids[0]).delete_unclaimed()  # deleted before it ran
    drain()
    Job.objects.filter(pk=ids[1]).delete_unclaimed()  # pruned after it ran: counted
    assert callbacks("pruned") == []
    ended = sum(batches.totals("default", batch.pk).values())
    assert repair("default", batch.pk, ended) == 1
    [callback] = callbacks("pruned")
    assert callback.kwargs["batch"]["done"] == 3
    assert callback.kwargs["batch"]["cancelled"] == 1


def test_the_sweep_completes_a_batch_whose_member_ended_uncounted() -> None:
    batch = enqueue_batch(members(2), on_complete=spec("swept"))
    drain()
    Batch.objects.filter(pk=batch.pk).update(completed_at=None, callback_ids=[])
    Job.objects.filter(task=ON_BATCH).delete()
    BatchCounter.objects.filter(batch_id=batch.pk).update(done=0)
    Job.objects.filter(batch_id=batch.pk).update(batch_counted=False)
    assert Sweeper().run() == (0, 0)  # counts look short, not stuck yet
    assert repair("default", batch.pk, 0) == 1
    assert len(callbacks("swept")) == 1


@pytest.mark.parametrize(
    ("callback", "message"),
    [
        ({"args": ["x"]}, "needs a 'task'"),
        ({"task": flow_jobs.value, "args": [1]}, "batch"),  # takes no 'batch'
        ({"task": flow_jobs.on_batch, "args": ["x"], "run_after": 5}, "run_after"),
        ({"task": flow_jobs.on_batch, "kwargs": {"tag": "x", "batch": {}}}, "given by"),
        ("no.such.task", "no.such.task"),
    ],
)
def test_bad_callbacks_are_refused_and_nothing_is_written(callback, message) -> None:
    with pytest.raises(InvalidJob, match=message):
        enqueue_batch(members(2), on_complete=callback)
    assert not Job.objects.exists()
    assert not Batch.objects.exists()


def test_a_bad_member_writes_nothing() -> None:
    with pytest.raises(InvalidJob, match="job 1"):
        enqueue_batch([*members(1), {"task": "no.such.task"}], on_complete=spec("x"))
    assert not Job.objects.exists()
    assert not Batch.objects.exists()


def test_retention_prunes_completed_batches_and_members_pruned_early_stay_counted() -> None:
    from datetime import timedelta

    from django.utils import timezone

    from django_dbqueue.models import Batch as BatchRow
    from django_dbqueue.queue.retention import Cutoff, prune

    def cutoffs(*statuses: str) -> list[Cutoff]:
        return [Cutoff(status, timezone.now() + timedelta(seconds=1)) for status in statuses]

    # A member pruned before its batch completes: counted when it ended, so the batch
    # completes once the others end, with it among the done.
    early = enqueue_batch(members(1), on_complete=spec("early"), close=False)
    drain()
    assert prune(cutoffs(Job.Status.DONE))[0] == 1
    add_to_batch(early, members(2))
    close_batch(early)
    open_batch = enqueue_batch(members(1), close=False)  # never closed: never completes
    drain()
    [callback] = callbacks("early")
    assert callback.kwargs["batch"]["done"] == 3
    assert BatchRow.objects.filter(completed_at__isnull=False).count() == 1
    # Pruning only some statuses keeps the batches: their members may be kept longer.
    prune(cutoffs(Job.Status.DONE, Job.Status.FAILED))
    assert BatchRow.objects.count() == 2
    assert prune(cutoffs("done", "failed", "cancelled"))[1]  # everything due deleted
    assert list(BatchRow.objects.values_list("id", flat=True)) == [open_batch.pk]
    assert set(BatchCounter.objects.values_list("batch_id", flat=True)) == {open_batch.pk}
    # A completed batch younger than the cutoffs stays.
    young = enqueue_batch(members(1))
    drain()
    old = [Cutoff(s, timezone.now() - timedelta(hours=1)) for s in ("done", "failed", "cancelled")]
    prune(old)
    assert BatchRow.objects.filter(pk=young.pk, completed_at__isnull=False).exists()
