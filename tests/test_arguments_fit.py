"""Arguments are checked against the task's signature at enqueue (and for schedules), and
a misspelt task path gets the registered paths closest to it."""

from __future__ import annotations

import re
from typing import Any

import pytest

from django_dbqueue import enqueue, enqueue_many, job, registry
from django_dbqueue.exceptions import InvalidJob, InvalidJobArguments, ScheduleError
from django_dbqueue.models import Job
from django_dbqueue.scheduling.checks import check_schedules
from django_dbqueue.signatures import Parameters
from tests.support.jobs import add, record

pytestmark = pytest.mark.django_db

ADD = "tests.support.jobs.add(a, b)"


def two(first: int, second: int) -> None:
    """Registered by the tests below (with a schedule), not at import."""


@pytest.mark.parametrize(
    ("args", "kwargs", "named"),
    [
        ([1, 2, 3], {}, "too many positional arguments (3 given)"),
        ([1], {}, "missing a required argument: 'b'"),
        ([1, 2], {"c": 3}, "got an unexpected keyword argument 'c'"),
        ([1], {"a": 2}, "multiple values for argument 'a'"),
        ([], {"a": 1}, "missing a required argument: 'b'"),
    ],
)
def test_arguments_that_do_not_fit_are_refused_naming_the_parameter(
    args: list[Any], kwargs: dict[str, Any], named: str
) -> None:
    for task in (add, "tests.support.jobs.add"):
        with pytest.raises(InvalidJobArguments) as caught:
            enqueue(task, args=args, kwargs=kwargs)
        assert str(caught.value) == f"the arguments do not fit {ADD}: {named}."
    assert isinstance(caught.value, TypeError)  # as Python's own call would be
    assert Job.objects.count() == 0


def test_arguments_that_fit_are_taken_in_every_spelling() -> None:
    enqueue(add, args=[1, 2])
    enqueue(add, kwargs={"b": 2, "a": 1})
    enqueue(add, args=(1,), kwargs={"b": 2})
    enqueue(record, args=["key"])  # a default left out
    enqueue(record, kwargs={"key": "k", "sleep": 0.5})
    assert Job.objects.count() == 5


def test_enqueue_many_refuses_the_whole_batch_naming_the_job_and_parameter() -> None:
    jobs = [{"task": add, "args": [i, i]} for i in range(5)]
    jobs.insert(3, {"task": add, "args": [1], "kwargs": {"z": 2}})
    with pytest.raises(InvalidJob, match=re.escape("job 3: the arguments do not fit " + ADD)):
        enqueue_many(jobs, batch_size=2)  # the batches before it were inserted, then undone
    assert Job.objects.count() == 0
    with pytest.raises(InvalidJob, match=r"job 3: .* missing a required argument: 'b'"):
        enqueue_many(jobs)
    assert Job.objects.count() == 0


def test_unvalidated_producers_store_paths_they_cannot_check(settings: Any) -> None:
    settings.DBQUEUE = {**settings.DBQUEUE, "VALIDATE_TASKS": False}
    stored = enqueue("other_service.jobs.work", args=[1, 2, 3])
    assert stored.args == [1, 2, 3]
    with pytest.raises(InvalidJobArguments, match="'b'"):
        enqueue("tests.support.jobs.add", args=[1])  # a registered one still is checked


def test_a_schedule_setting_with_arguments_that_do_not_fit_is_a_check_error(
    settings: Any,
) -> None:
    settings.DBQUEUE = {
        **settings.DBQUEUE,
        "SCHEDULE": {
            "fits": {"task": "tests.support.jobs.add", "every": 60, "args": [1, 2]},
            "short": {"task": "tests.support.jobs.add", "every": 60, "args": [1]},
        },
    }
    errors = check_schedules(is_registered=lambda path: registry.registered(path) is not None)
    assert [(e.id, e.msg) for e in errors] == [
        (
            "django_dbqueue.E307",
            f"DBQUEUE['SCHEDULE']['short']: the arguments do not fit {ADD}: "
            "missing a required argument: 'b'.",
        )
    ]


def test_a_declared_schedule_with_arguments_that_do_not_fit_is_refused_at_import(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(registry, "_registry", dict(registry._registry))
    with pytest.raises(ScheduleError) as caught:
        job(schedule={"every": 60, "kwargs": {"first": 1, "second": 2, "third": 3}})(two)
    assert caught.value.field == "args"
    assert "got an unexpected keyword argument 'third'" in str(caught.value)
    assert str(caught.value).startswith(
        "@job(schedule=...) on tests.test_arguments_fit.two: the arguments do not fit "
        "tests.test_arguments_fit.two(first, second):"
    )
    job(schedule={"every": 60, "args": [1], "kwargs": {"second": 2}})(two)  # fits


@pytest.mark.parametrize(
    ("given", "meant"),
    [
        ("tests.support.jobs.sleeep", "tests.support.jobs.sleep"),
        ("tests.suport.jobs.record", "tests.support.jobs.record"),
        ("tests.support.job.add", "tests.support.jobs.add"),
    ],
)
def test_a_misspelt_path_gets_a_did_you_mean(given: str, meant: str) -> None:
    with pytest.raises(InvalidJob) as caught:
        enqueue(given)
    assert f"is not a registered task; did you mean '{meant}'? If not, decorate" in str(
        caught.value
    )
    assert Job.objects.count() == 0


def test_a_path_like_no_registered_one_gets_no_guess() -> None:
    with pytest.raises(InvalidJob) as caught:
        enqueue("billing.jobs.charge_customer")
    assert "did you mean" not in str(caught.value)


def plain(a, b, c=3):  # type: ignore[no-untyped-def]
    pass


def keyword_only(a, *, b, c=3):  # type: ignore[no-untyped-def]
    pass


def positional_only(a, /, b=2):  # type: ignore[no-untyped-def]
    pass


def star_args(a, *rest):  # type: ignore[no-untyped-def]
    pass


def anything(*args, **kwargs):  # type: ignore[no-untyped-def]
    pass


CALLS = [((), {}), ((1,), {}), ((1, 2), {}), ((1, 2, 3), {}), ((1, 2, 3, 4), {})]
CALLS += [((1,), {"b": 2}), ((), {"a": 1, "b": 2}), ((1,), {"a": 1}), ((1,), {"z": 1})]
CALLS += [((1, 2), {"c": 3}), ((), {"a": 1, "b": 2, "c": 3}), ((), {"b": 2}), ((1,), {"c": 3})]
CALLS += [((1, 2, 3), {"c": 3}), ((), {"a": 1, "c": 3})]


@pytest.mark.parametrize("function", [plain, keyword_only, positional_only, star_args, anything])
def test_the_counted_check_agrees_with_python_for_every_kind_of_parameter(function: Any) -> None:
    """Parameters.check counts positional arguments instead of binding them where it can:
    it must accept exactly the calls Python accepts."""
    parameters = Parameters(function)
    for args, kwargs in CALLS:
        try:
            function(*args, **kwargs)
            python_takes = True
        except TypeError:
            python_takes = False
        try:
            parameters.check("p.f", list(args), kwargs)
            we_take = True
        except InvalidJobArguments:
            we_take = False
        assert we_take == python_takes, (function.__name__, args, kwargs)
