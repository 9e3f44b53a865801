from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from django_dbqueue import bounds, conf, enqueue, enqueue_many
from django_dbqueue.bulk import JobSpec
from django_dbqueue.exceptions import InvalidJob, TaskNotFound
from django_dbqueue.models import Job
from testproject.models import Execution
from tests.support import ROOT, jobs

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
        (lambda: enqueue(lambda: None), "lambdas have no name"),
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
        (lambda: enqueue("tests.support.jobs.does_not_exist"), "is not a registered task"),
        (lambda: enqueue("nosuchmodule.task"), "is not a registered task"),
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
    with pytest.raises(InvalidJob, match="dotted path"):
        enqueue("not a path")


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


# -- bounds: each hostile value of issue 13 is refused with InvalidJob, nothing written --


def refused(message: str, call: Callable[[], object]) -> None:
    with pytest.raises(InvalidJob, match=message):
        call()
    assert Job.objects.count() == 0


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), 1e308])
def test_timeout_must_be_finite_and_bounded(value: float) -> None:
    refused("timeout must be a", lambda: enqueue(jobs.noop, timeout=value))


def test_timeout_of_thirty_days_is_the_maximum() -> None:
    job = enqueue(jobs.noop, timeout=bounds.MAX_TIMEOUT)
    assert Job.objects.get(pk=job.pk).timeout == bounds.MAX_TIMEOUT
    job.delete()
    refused("at most 2.592e\\+06", lambda: enqueue(jobs.noop, timeout=bounds.MAX_TIMEOUT + 1))


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1e308, -1])
def test_retry_backoff_must_be_finite_and_bounded(value: float) -> None:
    refused("retry_backoff must be a", lambda: enqueue(jobs.noop, retry_backoff=value))


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), 1e308])
def test_run_after_seconds_must_be_finite(value: float) -> None:
    refused(
        "run_after must (be a finite number|lie within)",
        lambda: enqueue(jobs.noop, run_after=value),
    )


def test_run_after_of_1e20_seconds_is_refused_not_an_overflow() -> None:
    refused("run_after must lie within", lambda: enqueue(jobs.noop, run_after=1e20))


def test_run_after_of_a_huge_integer_is_refused() -> None:
    refused("run_after must", lambda: enqueue(jobs.noop, run_after=10**400))


def test_run_after_timedelta_beyond_a_century_is_refused() -> None:
    refused("run_after must lie within", lambda: enqueue(jobs.noop, run_after=timedelta.max))


def test_run_after_datetime_in_year_9999_is_refused() -> None:
    far = datetime(9999, 12, 31, tzinfo=UTC)
    refused("run_after must lie within", lambda: enqueue(jobs.noop, run_after=far))


def test_run_after_datetime_in_year_1_is_refused() -> None:
    early = datetime(1, 1, 1, tzinfo=UTC)
    refused("run_after must lie within", lambda: enqueue(jobs.noop, run_after=early))


def test_run_after_a_year_ahead_is_stored() -> None:
    job = enqueue(jobs.noop, run_after=timedelta(days=365))
    assert Job.objects.get(pk=job.pk).run_after == job.run_after


def test_max_attempts_of_2_to_the_31_is_refused() -> None:
    refused("at most 1000", lambda: enqueue(jobs.noop, max_attempts=2**31))


def test_max_attempts_maximum_is_stored() -> None:
    job = enqueue(jobs.noop, max_attempts=bounds.MAX_ATTEMPTS_LIMIT)
    assert Job.objects.get(pk=job.pk).max_attempts == 1000


def nested(levels: int) -> object:
    value: object = 1
    for _ in range(levels):
        value = [value]
    return value


def test_arguments_nested_5000_levels_are_refused_not_a_recursion_error() -> None:
    refused("nested deeper than 30 levels", lambda: enqueue(jobs.noop, args=[nested(5000)]))


def test_kwargs_nested_5000_levels_are_refused() -> None:
    deep: object = {}
    for _ in range(5000):
        deep = {"d": deep}
    refused("nested deeper than 30 levels", lambda: enqueue(jobs.noop, kwargs={"x": deep}))


def test_arguments_nested_31_levels_are_refused() -> None:
    refused("nested deeper", lambda: enqueue(jobs.noop, args=[nested(31)]))


def test_arguments_nested_30_levels_are_stored_on_every_database() -> None:
    # MariaDB's JSON check refuses 32 levels; the args list is one of them.
    job = enqueue(jobs.noop, args=[nested(30)], kwargs={"k": nested(30)})
    stored = Job.objects.get(pk=job.pk)
    assert stored.args == [nested(30)] and stored.kwargs == {"k": nested(30)}


def test_payload_of_20_mb_is_refused() -> None:
    refused(
        "more than DBQUEUE\\['MAX_PAYLOAD_BYTES'\\]", lambda: enqueue(jobs.noop, ["x" * 20_000_000])
    )


def test_payload_limit_counts_args_and_kwargs_together() -> None:
    half = "x" * (bounds_default_payload() // 2)
    refused("MAX_PAYLOAD_BYTES", lambda: enqueue(jobs.noop, [half], {"k": half}))


def test_payload_just_under_the_limit_is_stored_on_every_database() -> None:
    text = "x" * (bounds_default_payload() - 10)
    job = enqueue(jobs.noop, [text])
    assert Job.objects.get(pk=job.pk).args == [text]


def test_payload_limit_is_a_setting(settings: object) -> None:
    settings.DBQUEUE = {**settings.DBQUEUE, "MAX_PAYLOAD_BYTES": 100}  # type: ignore[attr-defined]
    refused("more than DBQUEUE", lambda: enqueue(jobs.noop, ["x" * 100]))


def bounds_default_payload() -> int:
    return int(conf.DEFAULTS["MAX_PAYLOAD_BYTES"])


def test_a_nul_character_in_arguments_is_refused() -> None:
    # PostgreSQL cannot store \u0000 in jsonb: a raw DataError before.
    refused("NUL character", lambda: enqueue(jobs.noop, ["a\x00b"]))


def test_a_nul_character_in_a_kwargs_key_is_refused() -> None:
    refused("NUL character", lambda: enqueue(jobs.noop, kwargs={"a\x00": 1}))


def test_an_escaped_backslash_before_u0000_is_not_a_nul() -> None:
    texts = ["C:\\u0000", "\\\\u0000"]  # a backslash (two) and then the text u0000
    job = enqueue(jobs.noop, texts)
    assert Job.objects.get(pk=job.pk).args == texts


def test_enqueue_many_checks_the_same_bounds() -> None:
    with pytest.raises(InvalidJob, match="job 1: timeout must be"):
        enqueue_many([{"task": jobs.noop}, {"task": jobs.noop, "timeout": float("nan")}])
    assert Job.objects.count() == 0


# -- newcomer mistakes (issue 11): the message names the public call ----------------------


def test_misspelt_option_is_a_type_error_naming_enqueue_and_the_options() -> None:
    with pytest.raises(TypeError) as caught:
        enqueue(jobs.noop, priorty=3)
    message = str(caught.value)
    assert message.startswith("enqueue() got an unexpected option 'priorty'")
    assert "did you mean 'priority'?" in message
    assert "Valid options: queue, priority, run_after, max_attempts, timeout" in message
    assert "build_job" not in message
    assert Job.objects.count() == 0


def test_internal_keywords_are_not_options_of_enqueue() -> None:
    for name in ("backend", "now", "defaults", "check_task"):
        with pytest.raises(TypeError, match=f"enqueue\\(\\) got an unexpected option '{name}'"):
            enqueue(jobs.noop, **{name: None})
    assert Job.objects.count() == 0


def test_misspelt_option_in_enqueue_many_names_the_job() -> None:
    with pytest.raises(
        TypeError, match="job 1: enqueue_many\\(\\) got an unexpected option 'queu'"
    ):
        enqueue_many([{"task": jobs.noop}, {"task": jobs.noop, "queu": "emails"}])
    with pytest.raises(TypeError, match="did you mean 'max_attempts'"):
        enqueue_many([JobSpec(jobs.noop, options={"max_attempt": 2})])
    assert Job.objects.count() == 0


def test_a_bound_method_is_refused_with_its_own_message() -> None:
    order = Execution(key="order-1")
    refused("is a bound method", lambda: enqueue(order.save))


def test_a_bound_builtin_method_is_refused() -> None:
    refused("is a bound method", lambda: enqueue([].append, [1]))


def test_a_function_of_main_is_refused_with_its_own_message() -> None:
    namespace: dict[str, object] = {"__name__": "__main__"}
    exec("def typed_in_a_script():\n    return None", namespace)
    refused("defined in __main__", lambda: enqueue(namespace["typed_in_a_script"]))


def test_a_function_not_found_under_its_name_is_refused_with_its_own_message() -> None:
    def shell_function() -> None:
        return None

    # What manage.py shell makes: a module name, but nothing under that name in it.
    shell_function.__module__ = "django.core.management.commands.shell"
    shell_function.__qualname__ = "shell_function"
    refused("is not found under that name", lambda: enqueue(shell_function))


def test_a_function_typed_into_manage_py_shell_is_refused() -> None:
    code = (
        "from django_dbqueue import enqueue\n"
        "def send_mail():\n"
        "    return None\n"
        "try:\n"
        "    enqueue(send_mail)\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    env = {**os.environ, "DBQUEUE_DB": "sqlite", "DBQUEUE_DB_NAME": ":memory:"}
    out = subprocess.run(
        [sys.executable, "manage.py", "shell", "--no-imports", "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert out.startswith("InvalidJob ")
    assert "send_mail" in out
    assert "manage.py shell" in out or "__main__" in out


@pytest.mark.django_db(transaction=True)
def test_jobs_enqueued_is_sent_on_commit_only_with_the_created_jobs() -> None:
    from django_dbqueue import signals

    heard: list[list[int]] = []

    def receiver(sender: object, jobs: list[Job], **kwargs: object) -> None:
        heard.append([job.pk for job in jobs])

    signals.jobs_enqueued.connect(receiver)
    try:
        one = enqueue(jobs.noop)
        assert heard == [[one.pk]], "outside a transaction: at once"
        with transaction.atomic():
            two = enqueue(jobs.noop, unique_key="signal")
            enqueue(jobs.noop, unique_key="signal")  # the same job: not created again
            assert heard == [[one.pk]], "nothing before COMMIT"
        assert heard == [[one.pk], [two.pk]]
        with pytest.raises(RuntimeError), transaction.atomic():
            enqueue(jobs.noop)
            raise RuntimeError("rolled back")
        many = enqueue_many([{"task": jobs.noop}, {"task": jobs.noop}])
        assert heard == [[one.pk], [two.pk], [job.pk for job in many]]
    finally:
        signals.jobs_enqueued.disconnect(receiver)
