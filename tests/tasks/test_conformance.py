"""The framework's contract, checked on the framework's ImmediateBackend and on DBQueueBackend.

Every test of the first part runs twice, once per backend, and asserts the same thing:
what a ``@task`` user may rely on whichever backend runs the task. Where the backends
differ by design the test says so through a capability flag (``supports_defer``,
``supports_get_result``...), and docs/tasks.md lists every difference with its reason.
DBQueueBackend's tasks are run by a worker in this process (``Worker(burst=True)``); the
last part starts real ``run_jobs`` processes.
"""

from __future__ import annotations

import logging
import pickle
import sys
import textwrap
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings as django_settings
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from django_dbqueue import enqueue, registry
from django_dbqueue.exceptions import (
    InvalidJob,
    InvalidJobArguments,
    UnregisteredTask,
)
from django_dbqueue.models import Job
from django_dbqueue.tasks.backend import DBQueueBackend, DBQueueTask
from django_dbqueue.tasks.compat import (
    FRAMEWORK_MODULE,
    BaseTaskBackend,
    InvalidTask,
    InvalidTaskBackend,
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultMismatch,
    TaskResultStatus,
    task,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from django_dbqueue.worker.loop import Worker
from tests.support import Processes, wait_until
from tests.support import conformance_tasks as tasks

pytestmark = pytest.mark.django_db(transaction=True)

IMMEDIATE = f"{FRAMEWORK_MODULE}.backends.immediate.ImmediateBackend"
DBQUEUE = "django_dbqueue.backends.DBQueueBackend"
QUEUES = ["default", "emails", "reports"]
# The framework's logger: task_finished is logged there.
FRAMEWORK_LOGGER = "django.tasks" if FRAMEWORK_MODULE == "django.tasks" else "django_tasks"


def tasks_setting(backend: str, queues: list[str]) -> dict[str, Any]:
    # DBQueueBackend takes its queues from DBQUEUE['QUEUES']; the framework's backends
    # from the TASKS entry. Both get the same ones. "other" serves Task.backend.
    entry: dict[str, Any] = {"BACKEND": backend}
    if backend == IMMEDIATE:
        entry["QUEUES"] = queues
    return {"default": entry, "other": dict(entry)}


def dbqueue_setting(queues: list[str]) -> dict[str, Any]:
    # The framework's backends run a task once: so does DBQueueBackend here. Retries are
    # its own feature (docs/tasks.md, tests/tasks/test_backend.py).
    return {**django_settings.DBQUEUE, "QUEUES": queues, "MAX_ATTEMPTS": 1}


@dataclass
class Runner:
    """One backend under test, and how its tasks get run and read back."""

    path: str

    @property
    def backend(self) -> BaseTaskBackend:
        return task_backends["default"]

    @property
    def is_dbqueue(self) -> bool:
        return self.path == DBQUEUE

    def run(self) -> None:
        """Run what was enqueued (the ImmediateBackend ran it already)."""
        if self.is_dbqueue:
            Worker(burst=True, handle_signals=False).run()

    def read(self, result: TaskResult[Any, Any]) -> TaskResult[Any, Any]:
        """The result as another process would read it, where the backend can say."""
        if self.backend.supports_get_result:
            return self.backend.get_result(result.id)
        return result

    def without_queue(self, queue: str) -> AbstractContextManager[None]:
        """Settings in which ``queue`` has been removed since tasks were declared."""
        queues = [q for q in QUEUES if q != queue]
        return override_settings(
            TASKS=tasks_setting(self.path, queues), DBQUEUE=dbqueue_setting(queues)
        )


@pytest.fixture(params=[IMMEDIATE, DBQUEUE], ids=["immediate", "dbqueue"])
def runner(request: pytest.FixtureRequest) -> Iterator[Runner]:
    with override_settings(
        TASKS=tasks_setting(request.param, QUEUES), DBQUEUE=dbqueue_setting(QUEUES)
    ):
        yield Runner(request.param)


@pytest.fixture
def signals_seen() -> Iterator[list[tuple[str, type, TaskResult[Any, Any], BaseException | None]]]:
    """(signal, sender, task_result, the exception being handled when it was sent)."""
    seen: list[tuple[str, type, TaskResult[Any, Any], BaseException | None]] = []
    signals = {"enqueued": task_enqueued, "started": task_started, "finished": task_finished}

    def listener(name: str) -> Callable[..., None]:
        def receive(sender: type, task_result: TaskResult[Any, Any], **kwargs: Any) -> None:
            # Copied: the ImmediateBackend changes its TaskResult in place.
            seen.append((name, sender, _snapshot(task_result), sys.exc_info()[1]))

        return receive

    receivers = {name: listener(name) for name in signals}
    for name, signal in signals.items():
        signal.connect(receivers[name])
    yield seen
    for name, signal in signals.items():
        signal.disconnect(receivers[name])


def _snapshot(result: TaskResult[Any, Any]) -> TaskResult[Any, Any]:
    copy = TaskResult(
        task=result.task,
        id=result.id,
        status=result.status,
        enqueued_at=result.enqueued_at,
        started_at=result.started_at,
        last_attempted_at=result.last_attempted_at,
        finished_at=result.finished_at,
        args=list(result.args),
        kwargs=dict(result.kwargs),
        backend=result.backend,
        errors=list(result.errors),
        worker_ids=list(result.worker_ids),
    )
    object.__setattr__(copy, "_return_value", result._return_value)
    return copy


def using(declared: Task[..., Any], **options: Any) -> Task[..., Any]:
    """``declared.using(...)``, with DBQueueTask's options too (type checkers see Task)."""
    return cast(DBQueueTask, declared).using(**options)


# -- capabilities -------------------------------------------------------------------------


def test_capability_flags(runner: Runner) -> None:
    flags = {
        name: getattr(runner.backend, name)
        for name in ("supports_defer", "supports_async_task", "supports_get_result")
    }
    flags["supports_priority"] = runner.backend.supports_priority
    if runner.is_dbqueue:
        assert isinstance(runner.backend, DBQueueBackend)
        assert all(flags.values()), flags
    else:
        assert flags == {
            "supports_defer": False,
            "supports_async_task": True,
            "supports_get_result": False,
            "supports_priority": True,
        }


def test_check_finds_nothing_wrong(runner: Runner) -> None:
    assert list(runner.backend.check()) == []


def test_run_after_is_honoured_where_defer_is_supported(runner: Runner) -> None:
    later = timezone.now() + timedelta(hours=1)
    if not runner.backend.supports_defer:
        with pytest.raises(InvalidTask, match="run_after"):
            tasks.echo.using(run_after=later)
        return
    deferred = tasks.echo.using(run_after=later)
    result = deferred.enqueue("later")
    runner.run()
    assert runner.read(result).status == TaskResultStatus.READY, "not run before run_after"
    assert runner.read(result).task.run_after == later


def test_get_result_where_supported(runner: Runner) -> None:
    result = tasks.echo.enqueue(1)
    runner.run()
    if not runner.backend.supports_get_result:
        with pytest.raises(NotImplementedError):
            runner.backend.get_result(result.id)
        with pytest.raises(NotImplementedError):
            tasks.echo.get_result(result.id)
        with pytest.raises(NotImplementedError):
            result.refresh()
        return
    fetched = tasks.echo.get_result(result.id)
    assert (fetched.id, fetched.status, fetched.return_value) == (
        result.id,
        TaskResultStatus.SUCCESSFUL,
        {"args": [1], "kwargs": {}},
    )
    assert async_to_sync(tasks.echo.aget_result)(result.id).id == result.id
    with pytest.raises(TaskResultMismatch):
        tasks.fail.get_result(result.id)
    with pytest.raises(TaskResultMismatch):
        async_to_sync(tasks.fail.aget_result)(result.id)
    with pytest.raises(TaskResultDoesNotExist):
        runner.backend.get_result("123456789")


def test_async_task_function_runs(runner: Runner) -> None:
    assert runner.backend.supports_async_task
    result = tasks.async_double.enqueue(21)
    runner.run()
    result = runner.read(result)
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 42)


def test_async_enqueue(runner: Runner) -> None:
    result = async_to_sync(tasks.echo.aenqueue)("a", key="b")
    runner.run()
    assert runner.read(result).return_value == {"args": ["a"], "kwargs": {"key": "b"}}


# -- a successful task --------------------------------------------------------------------


def test_successful_task_reads_back(runner: Runner) -> None:
    result = tasks.echo.enqueue(1, "two", three=3)
    runner.run()
    result = runner.read(result)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.is_finished
    assert result.return_value == {"args": [1, "two"], "kwargs": {"three": 3}}
    assert (result.args, result.kwargs) == ([1, "two"], {"three": 3})
    assert result.errors == []
    assert result.attempts == 1 and len(result.worker_ids) == 1
    assert result.backend == "default"
    assert result.enqueued_at is not None and result.started_at is not None
    assert result.finished_at is not None
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result.last_attempted_at == result.started_at


def test_running_task_reads_its_own_start(runner: Runner) -> None:
    result = tasks.attempt_times.enqueue()
    runner.run()
    result = runner.read(result)
    assert result.status == TaskResultStatus.SUCCESSFUL
    seen = result.return_value
    assert seen["attempt"] == 1
    assert seen["started_at"] is not None, "context.task_result while RUNNING"
    assert seen["last_attempted_at"] == seen["started_at"]
    assert datetime.fromisoformat(seen["started_at"]) == result.started_at


def test_task_returning_none_succeeds(runner: Runner) -> None:
    result = tasks.give_back.enqueue("none")
    runner.run()
    result = runner.read(result)
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, None)


@pytest.mark.parametrize(
    ("argument", "received"),
    [((1, (2, 3)), [1, [2, 3]]), (b"bytes", "bytes"), ({"k": (1,)}, {"k": [1]})],
    ids=["tuple", "bytes", "dict-of-tuple"],
)
def test_arguments_are_normalized_as_json(runner: Runner, argument: Any, received: Any) -> None:
    result = tasks.echo.enqueue(argument, key=argument)
    assert (result.args, result.kwargs) == ([received], {"key": received})
    runner.run()
    assert runner.read(result).return_value == {"args": [received], "kwargs": {"key": received}}


@pytest.mark.parametrize(
    ("kind", "stored"),
    [("tuple", [1, 2]), ("bytes", "abc"), ("nested", {"a": [1, [2, [3]]]})],
)
def test_return_value_is_normalized_as_json(runner: Runner, kind: str, stored: Any) -> None:
    result = tasks.give_back.enqueue(kind)
    runner.run()
    result = runner.read(result)
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, stored)


def test_context_names_the_running_task_and_attempt(runner: Runner) -> None:
    options: dict[str, Any] = {"priority": 9, "queue_name": "reports", "backend": "other"}
    if runner.backend.supports_defer:
        options["run_after"] = timezone.now() - timedelta(minutes=5)
    enqueued = tasks.describe_context.using(**options)
    result = enqueued.enqueue("ctx")
    runner.run()
    seen = runner.read(result).return_value
    run_after = options.get("run_after")
    assert seen == {
        "tag": "ctx",
        "attempt": 1,
        "id": result.id,
        "task": {
            "module_path": "tests.support.conformance_tasks.describe_context",
            "priority": 9,
            "queue_name": "reports",
            "backend": "other",
            "run_after": run_after.isoformat() if run_after else None,
            "takes_context": True,
        },
    }


# -- result.task is the Task that was enqueued --------------------------------------------

# Each variant is a Task as a user may enqueue it; "defer" marks those that need
# supports_defer. DBQueueTask's own options are inert fields to the framework's backends.
VARIANTS: dict[str, tuple[Callable[[], Task[..., Any]], bool]] = {
    "as declared": (lambda: tasks.echo, False),
    "declared with options": (lambda: tasks.on_reports, False),
    "priority": (lambda: tasks.echo.using(priority=-7), False),
    "priority as a whole float": (lambda: tasks.echo.using(priority=5.0), False),  # type: ignore[arg-type]
    "queue_name": (lambda: tasks.echo.using(queue_name="emails"), False),
    "backend": (lambda: tasks.echo.using(backend="other"), False),
    "takes_context": (lambda: tasks.describe_context, False),
    "run_after in the future": (
        lambda: tasks.echo.using(run_after=timezone.now() + timedelta(days=1)),
        True,
    ),
    "run_after in the past": (
        lambda: tasks.echo.using(run_after=timezone.now() - timedelta(days=1)),
        True,
    ),
    "max_attempts": (lambda: using(tasks.echo, max_attempts=1), False),
    "timeout": (lambda: using(tasks.echo, timeout=30), False),
    "retry_backoff": (lambda: using(tasks.echo, retry_backoff=0.5), False),
    "unique_key": (lambda: using(tasks.echo, unique_key="conformance"), False),
    "everything": (
        lambda: using(
            tasks.describe_context,
            priority=-3,
            queue_name="emails",
            backend="other",
            run_after=timezone.now() - timedelta(seconds=30),
            max_attempts=1,
            timeout=60,
            retry_backoff=0,
            unique_key="all of them",
        ),
        True,
    ),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_result_task_is_the_enqueued_task(runner: Runner, variant: str) -> None:
    make, needs_defer = VARIANTS[variant]
    if needs_defer and not runner.backend.supports_defer:
        with pytest.raises(InvalidTask, match="run_after"):
            make()
        return
    enqueued = make()
    args = ["tag"] if enqueued.takes_context else []
    result = enqueued.enqueue(*args)
    assert result.task == enqueued
    assert runner.read(result).task == enqueued
    runner.run()
    finished = runner.read(result)
    assert finished.task == enqueued
    assert finished.backend == enqueued.backend
    waits = enqueued.run_after is not None and enqueued.run_after > timezone.now()
    assert finished.status == (TaskResultStatus.READY if waits else TaskResultStatus.SUCCESSFUL)
    if runner.backend.supports_get_result:
        result.refresh()
    assert result.task == enqueued


# -- a failing task -----------------------------------------------------------------------


def test_failure_is_recorded_with_its_exception(runner: Runner) -> None:
    result = tasks.fail.enqueue("kaput")
    runner.run()
    result = runner.read(result)
    assert result.status == TaskResultStatus.FAILED
    assert result.is_finished and result.finished_at is not None
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018 - the framework raises for a failed task
    assert result.attempts == 1
    [error] = result.errors
    assert error.exception_class_path == "builtins.ValueError"
    assert error.exception_class is ValueError
    assert error.traceback.startswith("Traceback (most recent call last):")
    assert error.traceback.rstrip().endswith("ValueError: kaput")


@pytest.mark.parametrize("kind", ["object", "datetime", "set"])
def test_return_value_json_cannot_hold_is_a_type_error(runner: Runner, kind: str) -> None:
    result = tasks.give_back.enqueue(kind)
    runner.run()
    result = runner.read(result)
    assert result.status == TaskResultStatus.FAILED
    [error] = result.errors
    assert error.exception_class_path == "builtins.TypeError"
    assert error.exception_class is TypeError


def test_finished_signal_of_a_failure_is_sent_with_the_exception_in_hand(
    runner: Runner,
    signals_seen: list[tuple[str, type, TaskResult[Any, Any], BaseException | None]],
) -> None:
    result = tasks.fail.enqueue("in hand")
    runner.run()
    [finished] = [entry for entry in signals_seen if entry[0] == "finished"]
    _, sender, task_result, handling = finished
    assert sender is type(runner.backend)
    assert task_result.id == result.id and task_result.status == TaskResultStatus.FAILED
    assert isinstance(handling, ValueError) and str(handling) == "in hand"


def test_failed_task_is_logged_with_its_exception(
    runner: Runner, caplog: pytest.LogCaptureFixture
) -> None:
    result = tasks.fail.enqueue("logged")
    with caplog.at_level(logging.INFO, logger=FRAMEWORK_LOGGER):
        runner.run()
    [record] = [
        r
        for r in caplog.records
        if r.name == FRAMEWORK_LOGGER and r.getMessage().endswith("state=FAILED")
    ]
    assert f"id={result.id}" in record.getMessage()
    assert record.levelno == logging.ERROR
    assert record.exc_info is not None
    assert isinstance(record.exc_info[1], ValueError) and str(record.exc_info[1]) == "logged"


# -- signals ------------------------------------------------------------------------------


def test_signals_of_a_successful_task(
    runner: Runner,
    signals_seen: list[tuple[str, type, TaskResult[Any, Any], BaseException | None]],
) -> None:
    result = tasks.echo.enqueue("sig")
    runner.run()
    assert [(name, r.id, r.status) for name, _, r, _ in signals_seen] == [
        ("enqueued", result.id, TaskResultStatus.READY),
        ("started", result.id, TaskResultStatus.RUNNING),
        ("finished", result.id, TaskResultStatus.SUCCESSFUL),
    ]
    assert {sender for _, sender, _, _ in signals_seen} == {type(runner.backend)}
    assert all(handling is None for *_, handling in signals_seen)
    finished = signals_seen[-1][2]
    assert finished.return_value == {"args": ["sig"], "kwargs": {}}
    assert signals_seen[1][2].worker_ids == finished.worker_ids


# -- what enqueue refuses -----------------------------------------------------------------

# Each is its own test: arguments JSON cannot hold.
NOT_JSON: dict[str, Any] = {
    "object": object(),
    "datetime": timezone.now(),
    "set": {1, 2},
    "dict with a tuple key": {(1, 2): "x"},
}


@pytest.mark.parametrize("value", list(NOT_JSON))
@pytest.mark.parametrize("call", ["enqueue", "aenqueue"])
def test_argument_json_cannot_hold_is_a_type_error(runner: Runner, value: str, call: str) -> None:
    def enqueue_it() -> None:
        if call == "enqueue":
            tasks.echo.enqueue(NOT_JSON[value])
        else:
            async_to_sync(tasks.echo.aenqueue)(key=NOT_JSON[value])

    with pytest.raises(TypeError) as raised:
        enqueue_it()
    if runner.is_dbqueue:
        assert isinstance(raised.value, InvalidJobArguments)
        assert not Job.objects.exists()


def test_bytes_that_are_not_utf8_are_a_value_error(runner: Runner) -> None:
    with pytest.raises(ValueError):
        tasks.echo.enqueue(b"\xff\xfe")
    if runner.is_dbqueue:
        assert not Job.objects.exists()


@pytest.mark.parametrize("priority", [101, -101, 1.5, 1000])
def test_priority_outside_the_range_is_refused(runner: Runner, priority: float) -> None:
    with pytest.raises(InvalidTask, match="priority must be a whole number between -100 and 100"):
        tasks.echo.using(priority=priority)  # type: ignore[arg-type]


@pytest.mark.parametrize("priority", [101, -101])
def test_priority_outside_the_range_is_refused_where_declared(
    runner: Runner, priority: int
) -> None:
    with pytest.raises(InvalidTask, match="priority"):
        task(priority=priority)(tasks.without_context)


@pytest.mark.parametrize("priority", [-100, 100])
def test_priority_at_the_bounds_is_accepted(runner: Runner, priority: int) -> None:
    result = tasks.echo.using(priority=priority).enqueue()
    runner.run()
    result = runner.read(result)
    assert (result.status, result.task.priority) == (TaskResultStatus.SUCCESSFUL, priority)


def test_unknown_queue_is_refused(runner: Runner) -> None:
    with pytest.raises(InvalidTask):
        tasks.echo.using(queue_name="nowhere")


@pytest.mark.parametrize("call", ["enqueue", "aenqueue"])
def test_queue_removed_since_the_task_was_declared_is_refused_by_enqueue(
    runner: Runner, call: str
) -> None:
    declared = tasks.on_reports  # queue_name="reports"
    with runner.without_queue("reports"), pytest.raises(InvalidTask, match="reports"):
        if call == "enqueue":
            declared.enqueue()
        else:
            async_to_sync(declared.aenqueue)()
    if runner.is_dbqueue:
        assert not Job.objects.exists()


def test_naive_run_after_is_refused(runner: Runner) -> None:
    with pytest.raises(InvalidTask, match="run_after"):
        tasks.echo.using(run_after=timezone.now().replace(tzinfo=None))


def test_unknown_backend_alias_is_refused(runner: Runner) -> None:
    with pytest.raises(InvalidTaskBackend):
        tasks.echo.using(backend="nowhere")


def test_takes_context_without_a_context_argument_is_refused(runner: Runner) -> None:
    with pytest.raises(InvalidTask, match="context"):
        task(takes_context=True)(tasks.without_context)


def test_function_not_at_module_level_is_refused(runner: Runner) -> None:
    def nested() -> None:
        pass

    with pytest.raises(InvalidTask, match="module level"):
        task(nested)


if hasattr(Task, "__reduce__") and "_reconstruct" in vars(Task):  # Django 6.1+

    def test_task_pickles_to_an_equal_task(runner: Runner) -> None:
        enqueued = using(tasks.echo, priority=4, queue_name="emails", max_attempts=2)
        assert pickle.loads(pickle.dumps(enqueued)) == enqueued


# -- differences docs/tasks.md lists, asserted so that the list stays true -----------------


@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "infinity"])
def test_non_finite_float_argument(runner: Runner, value: float) -> None:
    if runner.is_dbqueue:
        with pytest.raises(InvalidJobArguments):
            tasks.echo.enqueue(value)
        return
    result = tasks.echo.enqueue(value)
    assert result.status == TaskResultStatus.SUCCESSFUL


def test_dictionary_keys_that_are_not_strings(runner: Runner) -> None:
    result = tasks.echo.enqueue({1: "a"})
    runner.run()
    received = runner.read(result).return_value["args"][0]
    assert received == ({"1": "a"} if runner.is_dbqueue else {1: "a"})


def test_task_enqueued_inside_a_transaction(
    runner: Runner,
    signals_seen: list[tuple[str, type, TaskResult[Any, Any], BaseException | None]],
) -> None:
    with transaction.atomic():
        tasks.echo.enqueue()
        sent_inside = [name for name, *_ in signals_seen]
    assert sent_inside == ([] if runner.is_dbqueue else ["enqueued", "started", "finished"])
    assert [name for name, *_ in signals_seen][:1] == ["enqueued"], "sent on commit"


# -- DBQueueBackend only: its enqueue() and what the framework's backends cannot have --------


def test_plain_enqueue_of_a_task_with_non_json_arguments_is_a_type_error() -> None:
    with pytest.raises(TypeError) as raised:
        enqueue(tasks.echo, args=[timezone.now()])
    assert isinstance(raised.value, InvalidJobArguments) and isinstance(raised.value, InvalidJob)
    assert not Job.objects.exists()


def test_task_options_are_stored_only_where_they_differ() -> None:
    plain = tasks.echo.enqueue()
    later = timezone.now() + timedelta(hours=2)
    moved = using(tasks.echo, run_after=later, max_attempts=3).enqueue()
    assert Job.objects.get(pk=int(plain.id)).task_options is None
    assert Job.objects.get(pk=int(moved.id)).task_options == {
        "run_after": {"__datetime__": later.isoformat()},
        "max_attempts": 3,
    }


def test_result_task_survives_a_retry_and_a_cleared_unique_key() -> None:
    enqueued = using(tasks.fail, max_attempts=2, retry_backoff=0, unique_key="retried")
    result = enqueued.enqueue("again")
    Worker(burst=True, handle_signals=False).run()
    job = Job.objects.get(pk=int(result.id))
    assert (job.status, job.attempts, job.unique_key) == (Job.Status.FAILED, 2, None)
    assert job.run_after > job.created_at, "the retry moved run_after"
    result.refresh()
    assert result.task == enqueued
    assert len(result.errors) == 2


@pytest.mark.parametrize("outcome", ["succeeds", "fails"])
def test_retried_task_keeps_the_first_start_and_the_latest(outcome: str) -> None:
    enqueued = using(tasks.attempt_times, max_attempts=2, retry_backoff=0)
    result = enqueued.enqueue(failing_attempts=1 if outcome == "succeeds" else 2)
    Worker(burst=True, handle_signals=False).run()
    result.refresh()
    assert result.attempts == 2 and len(result.errors) == 1 + (outcome == "fails")
    assert result.started_at is not None and result.last_attempted_at is not None
    first_failed = datetime.fromisoformat(Job.objects.get(pk=int(result.id)).errors[0]["at"])
    # started_at: the first attempt's start, before that attempt failed; last_attempted_at:
    # the second's, after it.
    assert result.enqueued_at <= result.started_at <= first_failed < result.last_attempted_at
    assert result.finished_at is not None and result.last_attempted_at <= result.finished_at
    if outcome == "succeeds":
        seen = result.return_value
        assert seen["attempt"] == 2
        assert datetime.fromisoformat(seen["started_at"]) == result.started_at
        assert datetime.fromisoformat(seen["last_attempted_at"]) == result.last_attempted_at


def test_requeued_job_starts_afresh() -> None:
    result = using(tasks.attempt_times, max_attempts=2, retry_backoff=0).enqueue(failing_attempts=1)
    Worker(burst=True, handle_signals=False).run()
    before = tasks.attempt_times.get_result(result.id)
    Job.objects.filter(pk=int(result.id)).requeue()
    Worker(burst=True, handle_signals=False).run()
    after = tasks.attempt_times.get_result(result.id)
    assert after.status == TaskResultStatus.SUCCESSFUL and after.attempts == 2
    assert before.last_attempted_at is not None and after.started_at is not None
    assert after.started_at > before.last_attempted_at, "a requeue starts a new history"


def test_result_task_of_a_task_whose_queue_was_removed_since_is_still_the_enqueued_one() -> None:
    enqueued = tasks.on_reports.using(priority=-1)
    result = enqueued.enqueue()
    queues = [q for q in QUEUES if q != "reports"]
    with override_settings(DBQUEUE=dbqueue_setting(queues)):
        assert task_backends["default"].get_result(result.id).task == enqueued


# -- real run_jobs processes --------------------------------------------------------------


@pytest.mark.processes
def test_run_jobs_logs_a_failed_task_with_its_traceback(
    processes: Processes, worker_env: Callable[..., dict[str, str]]
) -> None:
    result = using(tasks.fail, max_attempts=1).enqueue("logged by run_jobs")
    env = worker_env()
    # Django 6 logs django.tasks through the "django" logger's console handler, which
    # writes only with DEBUG on; the backport's logger falls through to stderr.
    env["DJANGO_DEBUG"] = "1"
    proc = processes.run_jobs("--burst", env=env)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert f"Task id={result.id} path=tests.support.conformance_tasks.fail state=FAILED" in out
    after = out.split("state=FAILED", 1)[1]
    assert after.lstrip().startswith("Traceback (most recent call last):"), out
    assert "ValueError: logged by run_jobs" in after
    assert "NoneType: None" not in out


@pytest.mark.processes
def test_run_jobs_gives_back_the_enqueued_task(
    processes: Processes, worker_env: Callable[..., dict[str, str]]
) -> None:
    enqueued = using(
        tasks.describe_context,
        priority=7,
        queue_name="emails",
        run_after=timezone.now() - timedelta(minutes=1),
        max_attempts=2,
        timeout=120,
        unique_key="run_jobs",
    )
    result = enqueued.enqueue("real")
    proc = processes.run_jobs("--burst", env=worker_env())
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    fetched = tasks.describe_context.get_result(result.id)
    assert fetched.status == TaskResultStatus.SUCCESSFUL, out
    assert fetched.task == enqueued
    assert fetched.return_value["task"]["priority"] == 7
    assert fetched.return_value["task"]["run_after"] == enqueued.run_after.isoformat()  # type: ignore[union-attr]


@pytest.mark.processes
def test_running_tasks_read_their_start_times_while_running(
    processes: Processes, worker_env: Callable[..., dict[str, str]], tmp_path: Path
) -> None:
    # Two at once under --concurrency 2: a first attempt, and a second after a failure.
    release = tmp_path / "release"
    first = using(tasks.wait_for_file, max_attempts=1).enqueue(str(release))
    second = using(tasks.wait_for_file, max_attempts=2, retry_backoff=0).enqueue(
        str(release), failing_attempts=1
    )
    proc = processes.run_jobs("--burst", "--concurrency", "2", env=worker_env())

    def running(result: TaskResult[Any, Any], attempt: int) -> TaskResult[Any, Any] | None:
        fetched = tasks.wait_for_file.get_result(result.id)
        if fetched.status != TaskResultStatus.RUNNING or fetched.attempts != attempt:
            return None
        # Until the attempt has run SHOW_AFTER (0.5 s), the row may still show the
        # previous attempt's start (docs/tasks.md).
        first_start, last_start = fetched.started_at, fetched.last_attempted_at
        if first_start is None or last_start is None:
            return None
        return fetched if attempt == 1 or first_start < last_start else None

    one = wait_until(lambda: running(first, 1), timeout=60)
    two = wait_until(lambda: running(second, 2), timeout=60)
    assert one.started_at is not None and one.last_attempted_at == one.started_at
    assert one.enqueued_at <= one.started_at <= timezone.now()
    assert two.started_at is not None and two.last_attempted_at is not None
    assert two.enqueued_at <= two.started_at < two.last_attempted_at <= timezone.now()
    failed_at = datetime.fromisoformat(Job.objects.get(pk=int(second.id)).errors[0]["at"])
    assert two.started_at <= failed_at <= two.last_attempted_at
    release.touch()
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    for seen, result in ((one, first), (two, second)):
        done = tasks.wait_for_file.get_result(result.id)
        assert done.status == TaskResultStatus.SUCCESSFUL, out
        # What the supervisor wrote while it ran is what the worker recorded after.
        assert (done.started_at, done.last_attempted_at) == (
            seen.started_at,
            seen.last_attempted_at,
        )


@pytest.mark.processes
@pytest.mark.parametrize("framework_app", ["listed", "not listed"])
def test_manage_py_check_runs_the_backend_checks(
    processes: Processes,
    worker_env: Callable[..., dict[str, str]],
    tmp_path: Path,
    framework_app: str,
) -> None:
    # Nothing at startup imports django.tasks (Django 6), and the backport registers its
    # checks only as an installed app: the app makes sure they run all the same.
    settings_source = f"""
        from testproject.settings import *  # noqa: F403

        TASKS = {{"default": {{"BACKEND": "{DBQUEUE}", "QUEUES": ["default", "ghosts"]}}}}
        if {framework_app == "not listed"}:
            INSTALLED_APPS = [app for app in INSTALLED_APPS if app != "django_tasks"]
    """
    (tmp_path / "ghost_settings.py").write_text(textwrap.dedent(settings_source))
    env = worker_env()
    env["PYTHONPATH"] = str(tmp_path)
    env["DJANGO_SETTINGS_MODULE"] = "ghost_settings"
    proc = processes.start("check", env=env)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0, out
    assert "django_dbqueue.E202" in out and "ghosts" in out


@contextmanager
def module_only_here(tmp_path: Path, name: str, source: str) -> Iterator[Any]:
    """A module this process imports and a worker process cannot (code since deployed away)."""
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    sys.path.insert(0, str(tmp_path))
    try:
        yield __import__(name)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)
        # And out of the task registry, as in a process that never had the module.
        for path in [p for p in registry._registry if p.startswith(f"{name}.")]:
            del registry._registry[path]


@pytest.mark.processes
def test_task_that_no_longer_imports_fails_with_an_import_error(
    processes: Processes, worker_env: Callable[..., dict[str, str]], tmp_path: Path
) -> None:
    source = """
        from django_dbqueue.tasks.compat import task

        @task
        def vanished():
            return "never runs"
    """
    with module_only_here(tmp_path, "conformance_vanishing", source) as module:
        result = using(module.vanished, max_attempts=1).enqueue()
        proc = processes.run_jobs("--burst", env=worker_env())
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, out
        fetched = module.vanished.get_result(result.id)
    assert fetched.status == TaskResultStatus.FAILED
    [error] = fetched.errors
    assert issubclass(error.exception_class, ImportError)
    assert error.exception_class is UnregisteredTask  # a TaskNotFound: never retried
    assert "conformance_vanishing" in error.traceback
    # Without the module, the job is no task result any more; the row says why.
    with pytest.raises(TaskResultDoesNotExist, match="not a registered task"):
        task_backends["default"].get_result(result.id)
    stored = Job.objects.get(pk=int(result.id)).errors[0]["exception_class_path"]
    recorded = TaskError(exception_class_path=stored, traceback="")
    assert issubclass(recorded.exception_class, ImportError)
