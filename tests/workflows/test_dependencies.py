"""depends_on: WAITING until every dependency is DONE, cancelled (transitively) or run
anyway when one fails, results readable, bad input refused with nothing written."""

from __future__ import annotations

import pytest

from django_dbqueue import enqueue
from django_dbqueue.exceptions import InvalidJob
from django_dbqueue.models import Dependency, Job
from django_dbqueue.worker.loop import Worker
from django_dbqueue.workflows.chains import chain, group
from django_dbqueue.workflows.results import dependency_results
from tests.support import flow_jobs

pytestmark = pytest.mark.django_db(transaction=True)


def drain() -> None:
    Worker(burst=True, handle_signals=False).run()


def status(job: Job) -> str:
    return job.refresh_status()


def test_a_job_waits_until_every_dependency_is_done_then_reads_their_results() -> None:
    a, b = enqueue(flow_jobs.value, [2]), enqueue(flow_jobs.value, [3])
    total = enqueue(flow_jobs.sum_dependencies, depends_on=[a, b.pk])
    assert status(total) == Job.Status.WAITING
    drain()
    assert status(total) == Job.Status.DONE
    total.refresh_from_db()
    assert total.result == 5
    assert dependency_results(total) == {a.pk: 2, b.pk: 3}


def test_a_failed_dependency_cancels_its_dependents_transitively_with_the_reason() -> None:
    bad = enqueue(flow_jobs.explode, max_attempts=1)
    child = enqueue(flow_jobs.value, [1], depends_on=[bad])
    grandchild = enqueue(flow_jobs.value, [1], depends_on=[child])
    drain()
    assert status(bad) == Job.Status.FAILED
    for job in (child, grandchild):
        job.refresh_from_db()
        assert job.status == Job.Status.CANCELLED
    assert f"dependency #{bad.pk} ended failed" in child.last_error
    assert f"dependency #{child.pk} ended cancelled" in grandchild.last_error


def test_run_on_failure_runs_the_dependent_and_says_why() -> None:
    bad = enqueue(flow_jobs.explode, max_attempts=1)
    good = enqueue(flow_jobs.value, [4])
    after = enqueue(flow_jobs.sum_dependencies, depends_on=[bad, good], on_dependency_failure="run")
    drain()
    after.refresh_from_db()
    assert after.status == Job.Status.DONE
    assert after.result == 4
    assert f"dependency #{bad.pk} ended failed; run anyway" in after.last_error


def test_a_dependency_already_done_or_failed_at_enqueue() -> None:
    done = enqueue(flow_jobs.value, [1])
    drain()
    assert status(enqueue(flow_jobs.value, [1], depends_on=[done])) == Job.Status.QUEUED
    bad = enqueue(flow_jobs.explode, max_attempts=1)
    drain()
    assert status(enqueue(flow_jobs.value, [1], depends_on=[bad])) == Job.Status.CANCELLED
    late = enqueue(flow_jobs.value, [1], depends_on=[bad], on_dependency_failure="run")
    assert status(late) == Job.Status.QUEUED


def test_an_operator_cancelling_a_dependency_cancels_the_dependents() -> None:
    first = enqueue(flow_jobs.value, [1])
    then = enqueue(flow_jobs.value, [1], depends_on=[first])
    assert Job.objects.filter(pk=first.pk).cancel() == (1, 0)
    assert status(then) == Job.Status.CANCELLED
    waiting = enqueue(flow_jobs.value, [1], depends_on=[enqueue(flow_jobs.value, [1])])
    assert Job.objects.filter(pk=waiting.pk).cancel() == (1, 0)  # WAITING jobs cancel too
    assert status(waiting) == Job.Status.CANCELLED


@pytest.mark.parametrize(
    ("depends_on", "message"),
    [
        ([10**12], "no job with id"),
        ("1", "must be a list"),
        ([0], "neither a saved job nor a job id"),
        ([True], "neither a saved job nor a job id"),
        ([1.5], "neither a saved job nor a job id"),
    ],
)
def test_bad_dependencies_are_refused_and_nothing_is_written(depends_on, message) -> None:
    real = enqueue(flow_jobs.value, [1])
    with pytest.raises(InvalidJob, match=message):
        enqueue(
            flow_jobs.value,
            [1],
            depends_on=[*([real] if message.startswith("no") else []), *depends_on]
            if isinstance(depends_on, list)
            else depends_on,
        )
    assert Job.objects.count() == 1
    assert not Dependency.objects.exists()
    assert Job.objects.get(pk=real.pk).workflow is False


def test_a_bad_failure_rule_is_refused() -> None:
    with pytest.raises(InvalidJob, match="'cancel' or 'run'"):
        enqueue(
            flow_jobs.value,
            [1],
            depends_on=[enqueue(flow_jobs.value, [1])],
            on_dependency_failure="ignore",
        )
    assert Job.objects.count() == 1


def test_a_chain_passes_each_result_on_and_a_group_fans_in() -> None:
    steps = chain(
        {"task": flow_jobs.value, "args": [1]},
        {"task": flow_jobs.plus_previous, "args": [10]},
        {"task": flow_jobs.plus_previous, "args": [100]},
    )
    members = group(*[{"task": flow_jobs.value, "args": [n]} for n in range(5)])
    total = enqueue(flow_jobs.sum_dependencies, depends_on=members)
    assert [status(j) for j in steps] == ["queued", "waiting", "waiting"]
    drain()
    steps[-1].refresh_from_db()
    total.refresh_from_db()
    assert steps[-1].result == 111
    assert total.result == 10


def test_a_chain_with_a_bad_step_writes_nothing() -> None:
    with pytest.raises(InvalidJob):
        chain({"task": flow_jobs.value, "args": [1]}, {"task": "no.such.task"})
    assert not Job.objects.exists()


def test_retention_forgets_the_edges_of_pruned_jobs_and_a_deleted_dependency_cancels() -> None:
    from datetime import timedelta

    from django.utils import timezone

    from django_dbqueue.queue.retention import Cutoff, prune
    from django_dbqueue.workflows.sweep import resolve_stuck

    first = enqueue(flow_jobs.value, [1])
    then = enqueue(flow_jobs.value, [2], depends_on=[first])
    drain()
    assert status(then) == Job.Status.DONE
    prune([Cutoff(Job.Status.DONE, timezone.now() + timedelta(seconds=1))])
    assert not Dependency.objects.exists()
    # A dependency deleted before it ended: the sweep resolves its dependent as cancelled.
    gone = enqueue(flow_jobs.value, [1])
    waiting = enqueue(flow_jobs.value, [1], depends_on=[gone])
    assert Job.objects.filter(pk=gone.pk).delete_unclaimed() == 1
    assert resolve_stuck("default") == 1
    waiting.refresh_from_db()
    assert waiting.status == Job.Status.CANCELLED
    assert f"dependency #{gone.pk} was deleted" in waiting.last_error
