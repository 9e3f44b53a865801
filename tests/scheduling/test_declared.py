"""Recurring schedules declared on the job: ``@job(schedule=...)``."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.conf import settings as django_settings
from django.test import override_settings

from django_dbqueue import job, registry
from django_dbqueue.checks import check_scheduled_tasks
from django_dbqueue.exceptions import ScheduleError
from django_dbqueue.models import Job
from django_dbqueue.scheduling.sources import all_schedules
from django_dbqueue.scheduling.ticks import Ticker
from tests.support import jobs

NOOP = f"{jobs.__name__}.noop"  # imported: registered

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Declarations made by a test leave the registry with the test."""
    monkeypatch.setattr(registry, "_registry", dict(registry._registry))
    yield


def with_schedule(schedule: dict[str, Any]) -> override_settings:
    return override_settings(DBQUEUE={**django_settings.DBQUEUE, "SCHEDULE": schedule})


def declare(**options: Any) -> str:
    """Register ``nightly`` (a module-level function) with ``@job(**options)``."""
    job(**options)(nightly)
    return f"{__name__}.nightly"


def nightly(day: str = "") -> str:
    return day


def test_declared_schedule_is_named_by_the_task_path_and_read_like_a_setting() -> None:
    path = declare(schedule={"cron": "0 3 * * *", "timezone": "Europe/Berlin", "args": ["x"]})
    [declared] = [s for s in all_schedules() if s.task == path]
    assert declared.name == path
    assert (declared.cron, declared.timezone, declared.args) == (
        "0 3 * * *",
        ZoneInfo("Europe/Berlin"),
        ("x",),
    )


def test_several_schedules_with_names_of_their_own() -> None:
    declare(
        schedule=[
            {"name": "nightly-berlin", "cron": "0 3 * * *", "timezone": "Europe/Berlin"},
            {"name": "every-minute", "every": 60, "queue": "reports"},
        ]
    )
    names = {s.name: s for s in all_schedules()}
    assert names["every-minute"].every == timedelta(seconds=60)
    assert names["every-minute"].queue == "reports"
    assert "nightly-berlin" in names


@pytest.mark.parametrize(
    ("schedule", "match"),
    [
        ({"cron": "0 25 * * *"}, "cron"),
        ({"cronn": "0 3 * * *"}, "Did you mean 'cron'"),
        ({"every": 60, "task": "other.path"}, "'task' is the decorated function"),
        ({"cron": "@daily", "timezone": "Europe/Berln"}, "Did you mean 'Europe/Berlin'"),
        ([{"every": 60}, {"every": 120}], "declared twice"),
        ("0 3 * * *", "must be a dict"),
    ],
    ids=["bad-cron", "typo", "task-given", "zone-typo", "unnamed-twice", "not-a-dict"],
)
def test_a_bad_declaration_fails_at_import_naming_the_task(schedule: Any, match: str) -> None:
    with pytest.raises(ScheduleError, match=match) as raised:
        declare(schedule=schedule)
    assert f"@job(schedule=...) on {__name__}.nightly" in str(raised.value)
    assert not any(s.task == f"{__name__}.nightly" for s in all_schedules())


def test_a_name_taken_by_the_setting_is_a_check_error_and_stops_the_scheduler() -> None:
    declare(schedule={"name": "nightly", "every": 60})
    setting = {"nightly": {"task": NOOP, "every": 30}}
    with with_schedule(setting):
        errors = check_scheduled_tasks()
        assert [e.id for e in errors] == ["django_dbqueue.E306"]
        assert "'nightly'" in errors[0].msg and "DBQUEUE['SCHEDULE']" in errors[0].msg
        with pytest.raises(ScheduleError, match="taken by DBQUEUE"):
            all_schedules()


def test_an_unknown_queue_in_a_declaration_is_a_check_error() -> None:
    declare(schedule={"every": 60, "queue": "nowhere"})
    errors = check_scheduled_tasks()
    assert [e.id for e in errors] == ["django_dbqueue.E304"]
    assert "nowhere" in errors[0].msg


@pytest.mark.django_db(transaction=True)
def test_the_scheduler_enqueues_declared_ticks() -> None:
    path = declare(schedule={"every": 5, "kwargs": {"day": "today"}})
    ticker = Ticker()
    ticker.run_due(T0)
    ticker.run_due(T0 + timedelta(seconds=5))
    assert list(Job.objects.filter(task=path).values_list("kwargs", flat=True)) == [
        {"day": "today"},
        {"day": "today"},
    ]
