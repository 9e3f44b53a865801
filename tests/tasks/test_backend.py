"""Django Tasks (@task functions) through DBQueueBackend, the Job table and the worker."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import django
import pytest
from asgiref.sync import async_to_sync
from django.core.checks import Error
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from django_dbqueue import enqueue
from django_dbqueue.exceptions import InvalidJob, InvalidJobArguments
from django_dbqueue.models import Job
from django_dbqueue.tasks.backend import DBQueueBackend, DBQueueTask
from django_dbqueue.tasks.compat import (
    FRAMEWORK_MODULE,
    InvalidTask,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from django_dbqueue.worker.loop import Worker
from testproject.models import Execution
from tests.support import Processes, conformance_tasks, jobs, task_functions

pytestmark = pytest.mark.django_db(transaction=True)

BACKEND = "django_dbqueue.backends.DBQueueBackend"


def drain() -> Worker:
    worker = Worker(burst=True, handle_signals=False)
    worker.run()
    return worker


@pytest.fixture
def received() -> Iterator[list[tuple[str, TaskResult[Any, Any]]]]:
    """The framework's signals, in the order they were sent."""
    seen: list[tuple[str, TaskResult[Any, Any]]] = []
    signals = {"enqueued": task_enqueued, "started": task_started, "finished": task_finished}

    def listener(name: str) -> Callable[..., None]:
        def receive(sender: Any, task_result: TaskResult[Any, Any], **kwargs: Any) -> None:
            # Not an assert: task_finished receivers run under send_robust().
            right_sender = isinstance(sender, type) and issubclass(sender, DBQueueBackend)
            seen.append((name if right_sender else f"{name} from {sender!r}", task_result))

        return receive

    receivers = {name: listener(name) for name in signals}
    for name, signal in signals.items():
        signal.connect(receivers[name])
    yield seen
    for name, signal in signals.items():
        signal.disconnect(receivers[name])


# -- the main path, with a real run_jobs process ------------------------------------------


@pytest.mark.processes
def test_task_enqueued_run_by_run_jobs_and_its_result_read_back(
    processes: Processes, worker_env: Callable[..., dict[str, str]]
) -> None:
    result = task_functions.add.enqueue(2, 3)
    assert result.status == TaskResultStatus.READY
    assert result.backend == "default"
    job = Job.objects.get(pk=int(result.id))
    assert (job.task, job.args, job.backend) == (
        "tests.support.task_functions.add",
        [2, 3],
        "default",
    )

    proc = processes.run_jobs("--burst", env=worker_env())
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out

    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.is_finished
    assert result.return_value == 5
    assert result.errors == []
    job.refresh_from_db()
    assert result.worker_ids == [job.owner] and job.owner
    assert result.attempts == 1
    assert result.enqueued_at == job.created_at
    assert result.started_at is not None and result.finished_at is not None
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result.last_attempted_at == result.started_at
    fetched = task_functions.add.get_result(result.id)
    assert (fetched.status, fetched.return_value, fetched.args) == (
        TaskResultStatus.SUCCESSFUL,
        5,
        [2, 3],
    )


# -- outcomes, in-process worker ----------------------------------------------------------


def test_failure_is_recorded_as_task_error() -> None:
    result = task_functions.fail.using(max_attempts=1).enqueue("kaput")
    drain()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018 - the framework raises for a failed task
    assert len(result.errors) == 1
    error = result.errors[0]
    assert error.exception_class_path == "builtins.ValueError"
    assert error.exception_class is ValueError
    assert "ValueError: kaput" in error.traceback
    assert "Traceback" in error.traceback
    assert result.finished_at is not None


def test_retry_counts_attempts_and_context_sees_them() -> None:
    result = task_functions.flaky.using(max_attempts=2, retry_backoff=0).enqueue("fl")
    drain()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    job = Job.objects.get(pk=int(result.id))
    assert result.return_value == {"attempt": 2, "id": result.id, "worker_ids": [job.owner] * 2}
    assert list(Execution.objects.order_by("id").values_list("attempt", flat=True)) == [1, 2]
    assert result.attempts == 2
    # The failed first attempt stays visible on the successful result.
    assert [e.exception_class_path for e in result.errors] == ["builtins.RuntimeError"]
    assert "fl: attempt 1 failed" in result.errors[0].traceback


def test_waiting_for_a_retry_is_ready() -> None:
    result = task_functions.fail.using(max_attempts=3, retry_backoff=3600).enqueue()
    drain()
    result.refresh()
    assert result.status == TaskResultStatus.READY
    assert result.attempts == 1
    assert len(result.errors) == 1
    with pytest.raises(ValueError, match="not finished"):
        result.return_value  # noqa: B018


def test_deferred_task_waits_for_run_after() -> None:
    later = timezone.now() + timedelta(hours=1)
    result = task_functions.add.using(run_after=later).enqueue(1, 1)
    assert result.task.run_after == later
    drain()
    result.refresh()
    assert result.status == TaskResultStatus.READY
    assert Job.objects.get(pk=int(result.id)).run_after == later
    # An hour passes.
    Job.objects.filter(pk=int(result.id)).update(run_after=timezone.now() - timedelta(seconds=1))
    drain()
    result.refresh()
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 2)


def test_higher_priority_runs_first() -> None:
    # record() is declared with priority=10 on the "emails" queue.
    low = task_functions.record.using(priority=-100).enqueue("low")
    default = task_functions.record.enqueue("ten")
    high = task_functions.record.using(priority=100).enqueue("high")
    middle = task_functions.record.using(priority=0).enqueue("zero")
    assert Job.objects.get(pk=int(low.id)).priority == -100
    drain()
    order = list(Execution.objects.order_by("id").values_list("key", flat=True))
    assert order == ["high", "ten", "zero", "low"]
    for result in (low, default, high, middle):
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
        assert result.task.queue_name == "emails"


def test_async_enqueue_and_async_task_function() -> None:
    async def scenario() -> tuple[TaskResult[Any, Any], TaskResult[Any, Any]]:
        first = await task_functions.async_add.aenqueue(20, 22)
        second = await task_functions.add.aenqueue(1, 2)
        return first, second

    first, second = async_to_sync(scenario)()
    assert Job.objects.filter(pk__in=[int(first.id), int(second.id)]).count() == 2
    drain()
    fetched = async_to_sync(task_functions.async_add.aget_result)(first.id)
    assert (fetched.status, fetched.return_value) == (TaskResultStatus.SUCCESSFUL, 42)
    async_to_sync(second.arefresh)()
    assert second.return_value == 3


def test_timeout_option_stops_the_task() -> None:
    result = task_functions.too_slow.enqueue(30)  # @task(max_attempts=1, timeout=0.5)
    job = Job.objects.get(pk=int(result.id))
    assert (job.max_attempts, job.timeout) == (1, 0.5)
    drain()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class_path == "django_dbqueue.exceptions.JobTimeout"
    assert "timeout of 0.5 s" in result.errors[0].traceback


def test_timeout_stops_waiting_for_an_async_task() -> None:
    result = task_functions.async_too_slow.enqueue(1.0)  # timeout=0.3
    after = task_functions.add.enqueue(1, 1)
    drain()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class_path == "django_dbqueue.exceptions.JobTimeout"
    after.refresh()
    assert after.return_value == 2, "the worker went on to the next job"


def test_claimed_job_reads_as_running_with_its_worker() -> None:
    result = task_functions.add.enqueue(1, 2)
    [job] = Job.objects.claim("host:1:abc", 10, ["default"])
    assert job.pk == int(result.id)
    result.refresh()
    assert result.status == TaskResultStatus.RUNNING
    assert result.worker_ids == ["host:1:abc"]
    assert not result.is_finished


def test_cancelled_job_reads_as_failed() -> None:
    result = task_functions.add.enqueue(1, 2)
    Job.objects.filter(pk=int(result.id)).update(
        status=Job.Status.CANCELLED, finished_at=timezone.now()
    )
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.is_finished


# -- signals ------------------------------------------------------------------------------


def test_signals_follow_the_job(received: list[tuple[str, TaskResult[Any, Any]]]) -> None:
    with transaction.atomic():
        ok = task_functions.add.enqueue(4, 4)
        assert received == [], "task_enqueued waits for the commit, like the job itself"
    with pytest.raises(RuntimeError), transaction.atomic():
        task_functions.add.enqueue(0, 0)
        raise RuntimeError("rolled back")
    bad = task_functions.fail.using(max_attempts=1).enqueue("no")
    assert Job.objects.count() == 2, "the rolled-back task was never enqueued"
    assert [(name, r.id) for name, r in received] == [("enqueued", ok.id), ("enqueued", bad.id)]
    received.clear()
    drain()
    events = [(name, r.id, r.status) for name, r in received]
    assert events == [
        ("started", ok.id, TaskResultStatus.RUNNING),
        ("started", bad.id, TaskResultStatus.RUNNING),
        ("finished", bad.id, TaskResultStatus.FAILED),
        ("finished", ok.id, TaskResultStatus.SUCCESSFUL),
    ] or events == [
        ("started", ok.id, TaskResultStatus.RUNNING),
        ("finished", ok.id, TaskResultStatus.SUCCESSFUL),
        ("started", bad.id, TaskResultStatus.RUNNING),
        ("finished", bad.id, TaskResultStatus.FAILED),
    ]
    started = {r.id: r for name, r in received if name == "started"}
    finished = {r.id: r for name, r in received if name == "finished"}
    assert started[ok.id].worker_ids and started[ok.id].started_at is not None
    assert finished[ok.id].return_value == 8
    assert finished[bad.id].errors[0].exception_class_path == "builtins.ValueError"
    # Sent after the write: what a receiver would read back is already final.
    assert task_functions.add.get_result(ok.id).status == TaskResultStatus.SUCCESSFUL


def test_no_finished_signal_for_an_attempt_that_will_be_retried(
    received: list[tuple[str, TaskResult[Any, Any]]],
) -> None:
    result = task_functions.flaky.using(max_attempts=2, retry_backoff=0).enqueue("sig")
    drain()
    names = [(name, r.status) for name, r in received if r.id == result.id]
    assert names == [
        ("enqueued", TaskResultStatus.READY),
        ("started", TaskResultStatus.RUNNING),
        ("started", TaskResultStatus.RUNNING),
        ("finished", TaskResultStatus.SUCCESSFUL),
    ]


def test_broken_finished_receiver_does_not_stop_the_worker(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(sender: Any, **kwargs: Any) -> None:
        raise RuntimeError("receiver bug")

    task_finished.connect(broken)
    try:
        results = [task_functions.add.enqueue(i, i) for i in range(3)]
        drain()
    finally:
        task_finished.disconnect(broken)
    for i, result in enumerate(results):
        result.refresh()
        assert result.return_value == 2 * i
    assert caplog.text.count("task_finished receiver") == 3
    assert "receiver bug" in caplog.text


# -- per-task options ---------------------------------------------------------------------


def test_task_class_options_reach_the_job() -> None:
    assert isinstance(task_functions.add, DBQueueTask)
    result = task_functions.add.using(
        max_attempts=7, timeout=12.5, retry_backoff=1.5, priority=3, queue_name="reports"
    ).enqueue(1, 2)
    job = Job.objects.get(pk=int(result.id))
    assert (job.max_attempts, job.timeout, job.retry_backoff) == (7, 12.5, 1.5)
    assert (job.priority, job.queue, job.backend) == (3, "reports", "default")
    assert result.task.max_attempts == 7  # type: ignore[attr-defined]


def test_unique_key_returns_the_waiting_task(
    received: list[tuple[str, TaskResult[Any, Any]]],
) -> None:
    first = task_functions.add.using(unique_key="sum").enqueue(1, 1)
    again = task_functions.add.using(unique_key="sum").enqueue(5, 5)
    assert again.id == first.id
    assert again.args == [1, 1]
    assert [name for name, _ in received] == ["enqueued"], "no signal for the duplicate"
    drain()
    third = task_functions.add.using(unique_key="sum").enqueue(5, 5)
    assert third.id != first.id, "the key is free again once the job finished"


def test_concurrency_key_is_a_template_over_each_call_and_bounds_the_claim() -> None:
    limited = task_functions.add.using(concurrency_key="sum:{0}", concurrency_limit=2)
    results = [limited.enqueue(1, n) for n in range(3)] + [limited.enqueue(2, 0)]
    rows = Job.objects.filter(pk__in=[int(r.id) for r in results]).order_by("pk")
    assert [(j.concurrency_key, j.concurrency_limit) for j in rows] == [
        ("sum:1", 2),
        ("sum:1", 2),
        ("sum:1", 2),
        ("sum:2", 2),
    ]
    assert results[0].task == limited, "the Task as enqueued, template and all"
    claimed = Job.objects.claim("w1", 10)
    assert sorted(j.concurrency_key for j in claimed) == ["sum:1", "sum:1", "sum:2"]
    with pytest.raises(InvalidTask, match="cannot be formatted with this job's arguments"):
        task_functions.add.using(concurrency_key="sum:{x}").enqueue(1, 1)


def test_bad_options_are_refused_when_declared() -> None:
    with pytest.raises(InvalidTask, match="concurrency_limit needs a concurrency_key"):
        task_functions.add.using(concurrency_limit=2)
    with pytest.raises(InvalidTask, match="concurrency_limit must be between 1"):
        task_functions.add.using(concurrency_key="k", concurrency_limit=0)
    with pytest.raises(InvalidTask, match="max_attempts must be an integer of at least 1"):
        task_functions.add.using(max_attempts=0)
    with pytest.raises(InvalidTask, match="timeout must be a positive number"):
        task_functions.add.using(timeout=-1)
    with pytest.raises(InvalidTask, match="unique_key must be a string of 1 to 255"):
        task_functions.add.using(unique_key="k" * 256)
    with pytest.raises(InvalidTask, match="priority must be a whole number between -100 and 100"):
        task_functions.add.using(priority=101)
    with pytest.raises(InvalidTask, match="run_after must be an aware datetime"):
        task_functions.add.using(run_after=timezone.now().replace(tzinfo=None))
    assert not Job.objects.exists()


def test_task_decorator_passes_the_backend_options_where_the_framework_does() -> None:
    def declare() -> Any:
        return task(max_attempts=2, timeout=5.0, unique_key="k", concurrency_key="c:{0}")(
            conformance_tasks.without_context
        )

    if FRAMEWORK_MODULE == "django.tasks" and django.VERSION[:2] == (6, 0):
        # Django 6.0's @task takes no options but its own: .using() it is (docs/tasks.md).
        with pytest.raises(TypeError, match="max_attempts"):
            declare()
        return
    declared = declare()
    assert isinstance(declared, DBQueueTask)
    assert (declared.max_attempts, declared.timeout, declared.unique_key) == (2, 5.0, "k")
    assert declared.concurrency_key == "c:{0}"


def test_enqueue_refuses_non_json_arguments() -> None:
    with pytest.raises(InvalidJobArguments, match="must be JSON-serializable") as raised:
        task_functions.add.enqueue(object(), 1)  # type: ignore[arg-type]
    assert isinstance(raised.value, TypeError) and isinstance(raised.value, InvalidJob)
    assert not Job.objects.exists()


def test_task_under_another_name_is_refused() -> None:
    with pytest.raises(InvalidTask, match="Workers import tasks by module path"):
        task_functions.renamed.enqueue()
    assert not Job.objects.exists()


# -- queues -------------------------------------------------------------------------------


def test_queue_must_be_a_dbqueue_queue() -> None:
    with pytest.raises(InvalidTask, match=r"Unknown queue 'nope'.*DBQUEUE\['QUEUES'\]"):
        task_functions.add.using(queue_name="nope")


def test_tasks_queues_narrow_what_the_backend_accepts() -> None:
    tasks = {"default": {"BACKEND": BACKEND, "QUEUES": ["default"]}}
    with override_settings(TASKS=tasks):
        task_functions.add.enqueue(1, 1)
        with pytest.raises(InvalidTask, match=r"'emails' is not in TASKS\['default'\]\['QUEUES'\]"):
            task_functions.add.using(queue_name="emails")
    assert Job.objects.count() == 1


def test_check_reports_tasks_queues_that_no_worker_runs() -> None:
    backend = DBQueueBackend("other", {"BACKEND": BACKEND, "QUEUES": ["default", "ghosts"]})
    messages = backend.check()
    assert [m.id for m in messages] == ["django_dbqueue.E202"]
    assert isinstance(messages[0], Error) and "ghosts" in messages[0].msg
    assert task_backends["default"].check() == []


def test_check_reports_the_app_missing() -> None:
    backend = DBQueueBackend("default", {"BACKEND": BACKEND})
    apps_without_us = ["django.contrib.contenttypes", "django.contrib.auth"]
    if FRAMEWORK_MODULE == "django_tasks":  # the backport is an app; Django 6 has none
        apps_without_us.append("django_tasks")
    with override_settings(INSTALLED_APPS=apps_without_us):
        messages = backend.check()
    assert [m.id for m in messages] == ["django_dbqueue.E201"]
    assert "INSTALLED_APPS" in str(messages[0].hint)


# -- results ------------------------------------------------------------------------------


def test_get_result_of_unknown_or_malformed_id() -> None:
    backend = task_backends["default"]
    with pytest.raises(TaskResultDoesNotExist, match="No task result"):
        backend.get_result("999999")
    with pytest.raises(TaskResultDoesNotExist, match="not a task result id"):
        backend.get_result("not-a-number")


def test_plain_job_is_not_a_task_result() -> None:
    job = enqueue(jobs.add, [1, 2])
    with pytest.raises(TaskResultDoesNotExist, match="plain function"):
        task_backends["default"].get_result(str(job.pk))


def test_task_enqueued_with_the_queue_api_runs_as_a_task() -> None:
    # The same table serves both: enqueue() with a Task object gets the framework too.
    job = enqueue(task_functions.flaky, ["api"], max_attempts=2, retry_backoff=0)
    drain()
    job.refresh_from_db()
    assert job.status == Job.Status.DONE
    assert job.result["attempt"] == 2
    result = task_backends["default"].get_result(str(job.pk))
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.backend == "default"
