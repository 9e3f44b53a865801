from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from django_dbqueue import enqueue, enqueue_many
from django_dbqueue.enqueueing import JobSpec
from django_dbqueue.exceptions import InvalidJob, TaskNotFound
from django_dbqueue.models import Job
from tests.support import jobs

pytestmark = pytest.mark.django_db


def test_enqueue_callable_stores_path_and_arguments() -> None:
    job = enqueue(jobs.add, [1, 2], queue="emails", priority=5)
    stored = Job.objects.get(pk=job.pk)
    assert stored.task == "tests.support.jobs.add"
    assert stored.args == [1, 2]
    assert stored.kwargs == {}
    assert stored.queue == "emails"
    assert stored.priority == 5
    assert stored.status == Job.Status.QUEUED
    assert stored.attempts == 0
    assert stored.max_attempts == 3


def test_enqueue_dotted_path_and_static_method() -> None:
    job = enqueue("tests.support.jobs.Tasks.static_add", args=(1, 2), kwargs={})
    assert job.task == "tests.support.jobs.Tasks.static_add"
    assert Job.objects.get(pk=job.pk).args == [1, 2]


def test_run_after_accepts_delay_and_datetime() -> None:
    before = timezone.now()
    delayed = enqueue(jobs.noop, run_after=timedelta(minutes=5))
    seconds = enqueue(jobs.noop, run_after=30)
    at = timezone.now() + timedelta(hours=1)
    fixed = enqueue(jobs.noop, run_after=at)
    assert delayed.run_after >= before + timedelta(minutes=5)
    assert seconds.run_after >= before + timedelta(seconds=30)
    assert Job.objects.get(pk=fixed.pk).run_after == at


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: enqueue(jobs.add, [object()]), "JSON-serializable"),
        (lambda: enqueue(jobs.add, [float("nan")]), "JSON-serializable"),
        (lambda: enqueue(jobs.add, kwargs={"when": timezone.now()}), "JSON-serializable"),
        (lambda: enqueue(lambda: None), "Lambdas"),
        (lambda: enqueue(_nested()), "inside a function"),
        (lambda: enqueue(jobs.noop, queue=""), "non-empty"),
        (lambda: enqueue(jobs.noop, queue="q" * 65), "longer than 64"),
        (lambda: enqueue(jobs.noop, queue="nope"), "Unknown queue 'nope'"),
        (lambda: enqueue(jobs.noop, max_attempts=-1), "max_attempts"),
        (lambda: enqueue(jobs.noop, max_attempts=0), "max_attempts"),
        (lambda: enqueue(jobs.noop, priority="high"), "priority"),
        (lambda: enqueue(jobs.noop, run_after="tomorrow"), "run_after"),
        (lambda: enqueue(jobs.noop, timeout=-5), "timeout"),
        (lambda: enqueue(jobs.add, "12"), "args must be a list"),
        (lambda: enqueue("tests.support.jobs.does_not_exist"), "has no 'does_not_exist'"),
        (lambda: enqueue("nosuchmodule.task"), "not found"),
        (lambda: enqueue("not a path"), "dotted path"),
    ],
)
def test_bad_input_raises_and_writes_nothing(call: object, message: str) -> None:
    with pytest.raises(InvalidJob, match=message):
        call()  # type: ignore[operator]
    assert Job.objects.count() == 0


def _nested() -> object:
    def inner() -> None:
        return None

    return inner


def test_unknown_task_path_is_a_task_not_found() -> None:
    with pytest.raises(TaskNotFound):
        enqueue("tests.support.jobs.missing")


def test_validation_of_paths_can_be_turned_off(settings: object) -> None:
    settings.DBQUEUE = {**settings.DBQUEUE, "VALIDATE_TASKS": False}  # type: ignore[attr-defined]
    job = enqueue("other_service.tasks.work")
    assert job.task == "other_service.tasks.work"


def test_unique_key_returns_the_waiting_job() -> None:
    first = enqueue(jobs.noop, unique_key="nightly")
    second = enqueue(jobs.noop, unique_key="nightly")
    assert second.pk == first.pk
    assert Job.objects.count() == 1
    Job.objects.filter(pk=first.pk).update(status=Job.Status.DONE, unique_key=None)
    third = enqueue(jobs.noop, unique_key="nightly")
    assert third.pk != first.pk


def test_unique_key_inside_a_transaction_keeps_the_transaction_usable() -> None:
    with transaction.atomic():
        first = enqueue(jobs.noop, unique_key="k")
        again = enqueue(jobs.noop, unique_key="k")
        other = enqueue(jobs.noop)
    assert again.pk == first.pk
    assert Job.objects.filter(pk=other.pk).exists()


def test_enqueue_many_inserts_all_or_nothing() -> None:
    created = enqueue_many(
        [JobSpec(jobs.add, [i, i]) for i in range(250)] + [{"task": jobs.noop, "queue": "emails"}]
    )
    assert len(created) == 251
    assert Job.objects.count() == 251
    assert Job.objects.filter(queue="emails").count() == 1
    with pytest.raises(InvalidJob, match="job 2:"):
        enqueue_many([JobSpec(jobs.noop), JobSpec(jobs.noop), JobSpec(jobs.add, [object()])])
    assert Job.objects.count() == 251


def test_enqueue_rolled_back_with_its_transaction() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        enqueue(jobs.noop)
        raise RuntimeError("the view failed")
    assert Job.objects.count() == 0
