"""DBQUEUE['SCHEDULE'] entries turned into schedules, and each mistake named."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from django_dbqueue.exceptions import ScheduleError
from django_dbqueue.scheduling.config import (
    parse_schedule,
    parse_schedules,
    schedules_from_settings,
)
from tests.scheduling.helpers import utc

# Pure computation: the same on every database, so only the SQLite run has it.
pytestmark = pytest.mark.only_vendor("sqlite")

ISSUE_EXAMPLE = {
    "nightly-report": {
        "task": "reports.jobs.nightly",
        "cron": "0 3 * * *",
        "timezone": "Europe/Berlin",
        "args": [],
        "queue": "default",
    },
    "poll-feeds": {"task": "feeds.jobs.poll", "every": 300},
}


def test_the_documented_example_parses() -> None:
    nightly, poll = parse_schedules(ISSUE_EXAMPLE)
    assert nightly.name == "nightly-report"
    assert nightly.task == "reports.jobs.nightly"
    assert nightly.cron == "0 3 * * *"
    assert nightly.timezone == ZoneInfo("Europe/Berlin")
    assert nightly.queue == "default"
    assert nightly.missed == "latest"
    assert poll.every == timedelta(seconds=300)
    assert poll.queue is None
    assert poll.args == ()
    assert poll.kwargs == {}


def test_every_option_is_kept() -> None:
    s = parse_schedule(
        "full",
        {
            "task": "app.jobs.run",
            "cron": "@hourly",
            "timezone": "America/New_York",
            "args": [1, "two", [3]],
            "kwargs": {"lang": "de"},
            "queue": "reports",
            "priority": -5,
            "max_attempts": 4,
            "timeout": 12.5,
            "missed": "all",
            "max_missed": 24,
        },
    )
    assert (s.args, s.kwargs, s.priority, s.max_attempts, s.timeout) == (
        (1, "two", [3]),
        {"lang": "de"},
        -5,
        4,
        12.5,
    )
    assert (s.missed, s.max_missed) == ("all", 24)


def test_args_may_be_a_tuple_and_come_back_as_json_would() -> None:
    s = parse_schedule("t", {"task": "a.b", "every": 60, "args": (1, (2, 3))})
    assert s.args == (1, [2, 3])


def test_every_may_be_a_timedelta() -> None:
    s = parse_schedule("t", {"task": "a.b", "every": timedelta(minutes=5)})
    assert s.every == timedelta(minutes=5)


def test_cron_without_timezone_uses_the_default() -> None:
    s = parse_schedule("t", {"task": "a.b", "cron": "0 3 * * *"}, default_timezone="Asia/Tokyo")
    assert s.next_tick(utc(2025, 1, 1)) == utc(2025, 1, 1, 18)


def test_settings_schedules_default_to_django_time_zone(settings: Any) -> None:
    settings.TIME_ZONE = "Europe/Berlin"
    settings.DBQUEUE = {**settings.DBQUEUE, "SCHEDULE": ISSUE_EXAMPLE}
    nightly, poll = schedules_from_settings()
    assert nightly.name == "nightly-report"
    assert poll.name == "poll-feeds"
    settings.DBQUEUE = {
        **settings.DBQUEUE,
        "SCHEDULE": {"n": {"task": "a.b", "cron": "0 3 * * *"}},
    }
    (only,) = schedules_from_settings()
    assert only.timezone == ZoneInfo("Europe/Berlin")


def test_no_schedule_setting_means_no_schedules(settings: Any) -> None:
    settings.DBQUEUE = {k: v for k, v in settings.DBQUEUE.items() if k != "SCHEDULE"}
    assert schedules_from_settings() == []


def test_a_removed_entry_is_simply_gone(settings: Any) -> None:
    settings.DBQUEUE = {**settings.DBQUEUE, "SCHEDULE": ISSUE_EXAMPLE}
    assert [s.name for s in schedules_from_settings()] == ["nightly-report", "poll-feeds"]
    settings.DBQUEUE = {**settings.DBQUEUE, "SCHEDULE": {"poll-feeds": ISSUE_EXAMPLE["poll-feeds"]}}
    assert [s.name for s in schedules_from_settings()] == ["poll-feeds"]


def test_the_error_is_a_value_error_naming_the_schedule() -> None:
    with pytest.raises(ValueError) as info:
        parse_schedules({"ok": {"task": "a.b", "every": 60}, "broken": {"task": "a.b"}})
    assert isinstance(info.value, ScheduleError)
    assert info.value.name == "broken"
    assert "DBQUEUE['SCHEDULE']['broken']" in str(info.value)


def error(entry: Any, name: Any = "s") -> ScheduleError:
    with pytest.raises(ScheduleError) as info:
        parse_schedule(name, entry)
    return info.value


# One test per hostile input.


def test_setting_that_is_not_a_dict() -> None:
    with pytest.raises(ScheduleError, match="must be a dict") as info:
        parse_schedules([{"task": "a.b", "every": 60}])
    assert info.value.name is None


def test_entry_that_is_not_a_dict() -> None:
    assert "must be a dict" in error("0 3 * * *").message


@pytest.mark.parametrize("name", ["", "   ", "x" * 101, 5, None])
def test_bad_name(name: Any) -> None:
    assert "schedule name" in error({"task": "a.b", "every": 60}, name=name).message


@pytest.mark.parametrize(
    ("key", "suggestion"),
    [("crom", "cron"), ("tiemzone", "timezone"), ("arg", "args"), ("queu", "queue")],
)
def test_unknown_key_suggests_the_closest(key: str, suggestion: str) -> None:
    exc = error({"task": "a.b", "cron": "0 3 * * *", key: 1})
    assert f"unknown key {key!r}" in exc.message
    assert f"Did you mean {suggestion!r}?" in exc.message


def test_unknown_key_without_a_close_match_lists_the_valid_ones() -> None:
    exc = error({"task": "a.b", "every": 60, "zzzzzz": 1})
    assert "Did you mean" not in exc.message
    assert "Valid keys: task, cron, every" in exc.message


def test_both_cron_and_every() -> None:
    exc = error({"task": "a.b", "cron": "0 3 * * *", "every": 60})
    assert "both 'cron' and 'every'" in exc.message


def test_neither_cron_nor_every() -> None:
    assert "neither 'cron' nor 'every'" in error({"task": "a.b"}).message


@pytest.mark.parametrize(
    "every",
    [0, -5, 0.5, math.nan, math.inf, -math.inf, 366 * 86400 + 1, 1e300, timedelta(0)],
)
def test_every_out_of_range(every: Any) -> None:
    exc = error({"task": "a.b", "every": every})
    assert exc.field == "every"
    assert "'every' must be from 1 second to 366 days" in exc.message


@pytest.mark.parametrize("every", ["300", True, None, [300]])
def test_every_not_a_number(every: Any) -> None:
    exc = error({"task": "a.b", "every": every})
    assert exc.field == "every"
    assert "number of seconds or a timedelta" in exc.message


def test_timezone_with_every() -> None:
    exc = error({"task": "a.b", "every": 60, "timezone": "UTC"})
    assert exc.field == "timezone"


@pytest.mark.parametrize("zone", ["Mars/Olympus", "", "../etc/passwd", "/etc/localtime", "Europe"])
def test_unknown_timezone(zone: str) -> None:
    exc = error({"task": "a.b", "cron": "0 3 * * *", "timezone": zone})
    assert exc.field == "timezone"
    assert f"unknown time zone {zone!r}" in exc.message


def test_timezone_in_the_wrong_case_suggests_the_right_one() -> None:
    exc = error({"task": "a.b", "cron": "0 3 * * *", "timezone": "europe/berlin"})
    assert "Did you mean 'Europe/Berlin'?" in exc.message


def test_timezone_not_a_string() -> None:
    assert error({"task": "a.b", "cron": "0 3 * * *", "timezone": 2}).field == "timezone"


@pytest.mark.parametrize("task", [None, "", "send_mail", "a..b", "a.b-c", "a.1b", 5, "a.b "])
def test_bad_task_path(task: Any) -> None:
    entry = {"cron": "0 3 * * *"} if task is None else {"task": task, "cron": "0 3 * * *"}
    assert error(entry).field == "task"


@pytest.mark.parametrize("args", ["abc", {"a": 1}, 5])
def test_args_not_a_list(args: Any) -> None:
    exc = error({"task": "a.b", "every": 60, "args": args})
    assert exc.field == "args"
    assert "'args' must be a list" in exc.message


@pytest.mark.parametrize("args", [[object()], [datetime(2025, 1, 1)], [math.nan], [{1, 2}], [b"x"]])
def test_args_not_json(args: Any) -> None:
    exc = error({"task": "a.b", "every": 60, "args": args})
    assert exc.field == "args"
    assert "JSON values only" in exc.message


@pytest.mark.parametrize("kwargs", [[1], "a=1", 5])
def test_kwargs_not_a_dict(kwargs: Any) -> None:
    assert error({"task": "a.b", "every": 60, "kwargs": kwargs}).field == "kwargs"


def test_kwargs_with_non_string_keys() -> None:
    exc = error({"task": "a.b", "every": 60, "kwargs": {1: "x"}})
    assert "keys must be strings" in exc.message


def test_kwargs_not_json() -> None:
    exc = error({"task": "a.b", "every": 60, "kwargs": {"when": datetime(2025, 1, 1)}})
    assert exc.field == "kwargs"


@pytest.mark.parametrize("queue", ["", "  ", 5, "q" * 65])
def test_bad_queue_name(queue: Any) -> None:
    assert error({"task": "a.b", "every": 60, "queue": queue}).field == "queue"


@pytest.mark.parametrize("priority", ["1", True, 1.5, 40000, -40000])
def test_bad_priority(priority: Any) -> None:
    assert error({"task": "a.b", "every": 60, "priority": priority}).field == "priority"


@pytest.mark.parametrize("max_attempts", [0, -1, "3", False])
def test_bad_max_attempts(max_attempts: Any) -> None:
    assert error({"task": "a.b", "every": 60, "max_attempts": max_attempts}).field == "max_attempts"


@pytest.mark.parametrize("timeout", [0, -1, math.nan, math.inf, "5", True])
def test_bad_timeout(timeout: Any) -> None:
    assert error({"task": "a.b", "every": 60, "timeout": timeout}).field == "timeout"


def test_unknown_missed_policy_suggests_the_closest() -> None:
    exc = error({"task": "a.b", "every": 60, "missed": "latset"})
    assert exc.field == "missed"
    assert "Did you mean 'latest'?" in exc.message


def test_max_missed_without_missed_all() -> None:
    exc = error({"task": "a.b", "every": 60, "max_missed": 10})
    assert exc.field == "max_missed"
    assert "'all' only" in exc.message


@pytest.mark.parametrize("max_missed", [0, -3, None, "10", 2.5])
def test_bad_max_missed(max_missed: Any) -> None:
    entry = {"task": "a.b", "every": 60, "missed": "all", "max_missed": max_missed}
    assert error(entry).field == "max_missed"
