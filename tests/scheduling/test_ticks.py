"""Due ticks become jobs once, however many schedulers look at the same moment."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from django_dbqueue.models import Job, ScheduleTick
from django_dbqueue.scheduling.config import parse_schedules
from django_dbqueue.scheduling.recurring import Tick
from django_dbqueue.scheduling.ticks import Ticker, enqueue_tick, last_ticks, prune_ticks

pytestmark = pytest.mark.django_db(transaction=True)
T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def schedules(**extra: object) -> list:  # type: ignore[type-arg]
    return parse_schedules(
        {
            "every-5s": {"task": "tests.support.jobs.add", "every": 5, "args": [1, 2]},
            "hourly": {"task": "tests.support.jobs.noop", "cron": "@hourly", "queue": "reports"},
            **extra,
        }
    )


def test_each_tick_is_enqueued_once_by_many_tickers_at_the_same_moment() -> None:
    tickers = [Ticker(schedules()) for _ in range(3)]
    for second in range(0, 31):
        now = T0 + timedelta(seconds=second)
        for ticker in tickers:
            ticker.run_due(now)
    ticks = list(ScheduleTick.objects.filter(schedule="every-5s").order_by("tick_at"))
    assert [t.tick_at for t in ticks] == [T0 + timedelta(seconds=s) for s in range(0, 31, 5)]
    jobs = Job.objects.filter(task="tests.support.jobs.add")
    assert jobs.count() == 7
    assert {t.job_id for t in ticks} == set(jobs.values_list("id", flat=True))
    assert ScheduleTick.objects.filter(schedule="hourly").count() == 1  # the 12:00 tick
    assert Job.objects.get(task="tests.support.jobs.noop").queue == "reports"


def test_a_second_insert_of_the_same_tick_is_refused_and_enqueues_nothing() -> None:
    schedule = schedules()[0]
    assert enqueue_tick(Tick(schedule, T0)) is not None
    assert enqueue_tick(Tick(schedule, T0)) is None
    assert Job.objects.count() == 1


def test_downtime_enqueues_the_latest_missed_tick_once() -> None:
    ticker = Ticker(schedules())
    ticker.run_due(T0)
    ticker.run_due(T0 + timedelta(hours=3, seconds=2))
    assert last_ticks(["every-5s", "hourly"]) == {
        "every-5s": T0 + timedelta(hours=3),
        "hourly": T0 + timedelta(hours=3),
    }
    assert ScheduleTick.objects.count() == 4


def test_a_clock_that_jumps_back_enqueues_nothing_twice() -> None:
    ticker = Ticker(schedules())
    for second in (0, 5, 10):
        ticker.run_due(T0 + timedelta(seconds=second))
    fresh = Ticker(schedules())  # e.g. a restarted worker on a host whose clock went back
    for second in (0, 5, 10):
        fresh.run_due(T0 + timedelta(seconds=second))
    assert ScheduleTick.objects.filter(schedule="every-5s").count() == 3


def test_a_removed_schedule_stops_and_a_new_one_starts_at_its_next_tick() -> None:
    Ticker(schedules()).run_due(T0)
    changed = parse_schedules(
        {"every-5s": {"task": "tests.support.jobs.add", "every": 10, "args": [1, 2]}}
    )
    ticker = Ticker(changed)
    ticker.run_due(T0 + timedelta(seconds=5))  # the old expression's tick: not the new one's
    ticker.run_due(T0 + timedelta(seconds=10))
    ticker.run_due(T0 + timedelta(hours=1))
    ticks = ScheduleTick.objects.filter(schedule="every-5s").order_by("tick_at")
    assert [t.tick_at - T0 for t in ticks] == [
        timedelta(0),
        timedelta(seconds=10),
        timedelta(hours=1),
    ]
    assert ScheduleTick.objects.filter(schedule="hourly").count() == 1


def test_a_tick_whose_job_is_invalid_is_recorded_without_a_job(
    caplog: pytest.LogCaptureFixture, settings: object
) -> None:
    ticker = Ticker(
        parse_schedules({"gone": {"task": "tests.support.jobs.add", "every": 5, "queue": "emails"}})
    )
    settings.DBQUEUE = {**settings.DBQUEUE, "QUEUES": ["default"]}  # type: ignore[attr-defined]
    ticker.run_due(T0)
    ticker.run_due(T0 + timedelta(seconds=1))
    tick = ScheduleTick.objects.get()
    assert tick.job_id is None
    assert not Job.objects.exists()
    assert "Schedule 'gone': tick" in caplog.text and "Unknown queue 'emails'" in caplog.text


def test_old_ticks_are_pruned_but_each_schedules_newest_is_kept() -> None:
    for days in (30, 20, 10):
        ScheduleTick.objects.create(schedule="monthly", tick_at=T0 - timedelta(days=days))
    for days in (9, 8, 1):
        ScheduleTick.objects.create(schedule="daily", tick_at=T0 - timedelta(days=days))
    assert prune_ticks(T0) == 4
    assert sorted((t.schedule, (T0 - t.tick_at).days) for t in ScheduleTick.objects.all()) == [
        ("daily", 1),
        ("monthly", 10),
    ]
