"""django_dbqueue.testing: run_due_jobs() runs due jobs in-process through the worker's path."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.test import TestCase

from django_dbqueue import enqueue, job
from django_dbqueue.exceptions import RetryJob
from django_dbqueue.models import Job
from django_dbqueue.pytest_plugin import run_due_jobs as run_due_jobs  # the fixture
from django_dbqueue.queue import clock
from django_dbqueue.queue.pausing import pause
from django_dbqueue.testing import JobOutcome, JobsTestMixin, TooManyJobs
from testproject.models import Execution
from tests.support import conformance_tasks
from tests.support.jobs import add, fail, noop

pytestmark = pytest.mark.django_db


@job
def kind_of(value: Any) -> str:
    """What the job received: a tuple enqueued comes back a list, as in a worker."""
    return type(value).__name__


@job
def parent(key: str) -> str:
    enqueue(child, args=[key])
    return key


@job
def child(key: str) -> str:
    Execution.objects.create(key=f"child-{key}", pid=0)
    return key


@job
def commit_then_record(key: str) -> None:
    transaction.on_commit(lambda: Execution.objects.create(key=key, pid=0))


@job
def rolled_back_commit(key: str) -> None:
    try:
        with transaction.atomic():
            transaction.on_commit(lambda: Execution.objects.create(key=key, pid=0))
            raise LookupError("roll back")
    except LookupError:
        pass


@job
def broken_commit() -> None:
    def broken() -> None:
        raise KeyError("callback")

    transaction.on_commit(broken)


@job
def broken_write(key: str) -> None:
    """Breaks the transaction it runs in (a NOT NULL column left empty), as a bug may."""
    Execution.objects.create(key=key, pid=1)
    Execution.objects.create(key=key, pid=None)


@job
def forever() -> None:
    enqueue(forever)


@job
def not_yet() -> None:
    raise RetryJob(delay=0, reason="again")


def test_runs_a_due_job_and_returns_its_outcome(run_due_jobs: Any) -> None:
    queued = enqueue(add, args=[2, 3])

    outcomes = run_due_jobs()

    assert [(o.job_id, o.task, o.status, o.result, o.error) for o in outcomes] == [
        (queued.id, "tests.support.jobs.add", "done", 5, None)
    ]
    assert isinstance(outcomes[0], JobOutcome) and outcomes[0].ok
    assert Job.objects.get(pk=queued.id).status == Job.Status.DONE
    assert run_due_jobs() == []


def test_arguments_make_the_json_round_trip(run_due_jobs: Any) -> None:
    enqueue(kind_of, args=[(1, 2)])
    assert [o.result for o in run_due_jobs()] == ["list"]


def test_a_failing_job_is_retried_later_then_failed(run_due_jobs: Any) -> None:
    queued = enqueue(fail, kwargs={"message": "nope"}, max_attempts=2)

    first = run_due_jobs()
    assert [(o.status, o.attempts) for o in first] == [("retry", 1)]
    assert isinstance(first[0].error, ValueError) and str(first[0].error) == "nope"
    assert run_due_jobs() == []  # its retry is not due yet

    Job.objects.filter(pk=queued.id).update(run_after=queued.created_at)
    second = run_due_jobs()
    assert [(o.status, o.attempts, type(o.error)) for o in second] == [("failed", 2, ValueError)]
    row = Job.objects.get(pk=queued.id)
    assert row.status == Job.Status.FAILED and "nope" in row.last_error


def test_follow_runs_the_jobs_that_jobs_enqueue(run_due_jobs: Any) -> None:
    enqueue(parent, args=["a"])
    outcomes = run_due_jobs()
    assert [(o.task.rsplit(".", 1)[1], o.status) for o in outcomes] == [
        ("parent", "done"),
        ("child", "done"),
    ]
    assert list(Execution.objects.values_list("key", flat=True)) == ["child-a"]


def test_without_follow_only_the_jobs_due_at_the_call_run(run_due_jobs: Any) -> None:
    enqueue(parent, args=["b"])
    assert [o.task for o in run_due_jobs(follow=False)] == ["tests.test_testing.parent"]
    left = Job.objects.get(task="tests.test_testing.child")
    assert (left.status, left.attempts) == (Job.Status.QUEUED, 0)
    assert [o.task for o in run_due_jobs(follow=False)] == ["tests.test_testing.child"]


def test_tasks_picks_the_jobs_and_leaves_the_others_as_they_were(run_due_jobs: Any) -> None:
    other = enqueue(noop)
    wanted = enqueue(add, args=[1, 1])
    by_path = enqueue("tests.support.jobs.add", args=[2, 2])

    outcomes = run_due_jobs(tasks=[add])

    assert [(o.job_id, o.result) for o in outcomes] == [(wanted.id, 2), (by_path.id, 4)]
    left = Job.objects.get(pk=other.id)
    assert (left.status, left.attempts) == (Job.Status.QUEUED, 0)
    assert [o.job_id for o in run_due_jobs(tasks=["tests.support.jobs.noop"])] == [other.id]


def test_queues_picks_the_queues(run_due_jobs: Any) -> None:
    default = enqueue(noop)
    emails = enqueue(noop, queue="emails")
    assert [o.job_id for o in run_due_jobs(queues=["emails"])] == [emails.id]
    assert Job.objects.get(pk=default.id).status == Job.Status.QUEUED


def test_paused_queues_are_skipped_as_workers_skip_them(run_due_jobs: Any) -> None:
    paused = enqueue(noop, queue="reports")
    running = enqueue(noop)
    pause("reports")
    assert [o.job_id for o in run_due_jobs()] == [running.id]
    assert Job.objects.get(pk=paused.id).status == Job.Status.QUEUED


def test_a_job_enqueued_in_a_rolled_back_atomic_block_does_not_run(run_due_jobs: Any) -> None:
    kept = enqueue(noop)
    with pytest.raises(LookupError), transaction.atomic():
        enqueue(add, args=[1, 2])
        raise LookupError
    assert [o.job_id for o in run_due_jobs()] == [kept.id]


def test_a_jobs_on_commit_callbacks_run_when_it_returns(run_due_jobs: Any) -> None:
    enqueue(commit_then_record, args=["kept"])
    enqueue(rolled_back_commit, args=["dropped"])
    assert [o.status for o in run_due_jobs()] == ["done", "done"]
    assert list(Execution.objects.values_list("key", flat=True)) == ["kept"]


def test_an_on_commit_callback_that_raises_fails_the_job(run_due_jobs: Any) -> None:
    enqueue(broken_commit, max_attempts=1)
    [outcome] = run_due_jobs()
    assert outcome.status == "failed" and isinstance(outcome.error, KeyError)


def test_a_job_that_breaks_the_transaction_fails_and_the_test_goes_on(
    run_due_jobs: Any,
) -> None:
    enqueue(broken_write, args=["taken"], max_attempts=1)
    kept = enqueue(add, args=[1, 2])
    outcomes = run_due_jobs()
    assert [(o.status, type(o.error).__name__) for o in outcomes] == [
        ("failed", "IntegrityError"),
        ("done", "NoneType"),
    ]
    assert outcomes[1].job_id == kept.id
    assert not Execution.objects.filter(key="taken").exists()  # rolled back to its savepoint


def test_a_job_that_enqueues_itself_stops_at_max_jobs(run_due_jobs: Any) -> None:
    enqueue(forever)
    with pytest.raises(TooManyJobs, match="max_jobs=5"):
        run_due_jobs(max_jobs=5)
    assert Job.objects.filter(status=Job.Status.CLAIMED).count() == 0


def test_a_retry_without_delay_runs_again_only_when_following(run_due_jobs: Any) -> None:
    enqueue(not_yet)
    assert [o.status for o in run_due_jobs(follow=False)] == ["retry"]
    with pytest.raises(TooManyJobs):
        run_due_jobs(max_jobs=3)


def test_what_is_due_is_judged_by_the_clock_enqueue_read(
    run_due_jobs: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The queue's clock may run ahead of the server's ``NOW()`` by the round trip of its
    reading (queue/clock.py), and on PostgreSQL ``NOW()`` is when the test's transaction
    began: a job enqueued just now is due all the same."""
    using = clock.job_database()
    reading = clock.reading(using)
    ahead = reading._replace(at=reading.at + timedelta(seconds=2))  # a slow reading
    monkeypatch.setitem(clock._readings, using, ahead)
    job = enqueue(add, args=[1, 2])
    assert [(o.job_id, o.status) for o in run_due_jobs(follow=False)] == [(job.id, "done")]


def test_an_unregistered_task_fails_at_once(run_due_jobs: Any) -> None:
    Job.objects.create(task="tests.support.jobs.no_such_job", max_attempts=3)
    [outcome] = run_due_jobs()
    assert outcome.status == "failed" and "no_such_job" in str(outcome.error)


def test_a_django_task_runs_through_the_framework(run_due_jobs: Any) -> None:
    result = conformance_tasks.echo.enqueue("x", n=1)
    [outcome] = run_due_jobs(tasks=[conformance_tasks.echo])
    assert (outcome.status, outcome.result) == ("done", {"args": ["x"], "kwargs": {"n": 1}})
    assert conformance_tasks.echo.get_result(result.id).status == "SUCCESSFUL"


class MixinTests(JobsTestMixin, TestCase):
    def test_run_due_jobs_inside_a_test_case(self) -> None:
        enqueue(add, args=[20, 22])
        outcomes = self.run_due_jobs()
        self.assertJobsDone(outcomes)
        self.assertEqual([o.result for o in outcomes], [42])

    def test_assert_jobs_done_names_the_failed_jobs(self) -> None:
        enqueue(fail, max_attempts=1)
        outcomes = self.run_due_jobs(tasks=[fail])
        with self.assertRaisesRegex(AssertionError, r"tests\.support\.jobs\.fail\): failed"):
            self.assertJobsDone(outcomes)
