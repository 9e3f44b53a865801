"""Tick times of interval schedules, which ticks are due, and many hosts agreeing on them."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from datetime import UTC, date, datetime, timedelta

import pytest

from django_dbqueue.scheduling.recurring import (
    EPOCH,
    GRACE,
    Schedule,
    Tick,
    collect_due_ticks,
    due_ticks,
    next_wakeup,
)
from tests.scheduling.helpers import cron, local, schedule, utc

# --- interval ("every") ticks ---


@pytest.mark.parametrize("every", [300, 7, 1.5, 86400, timedelta(minutes=10)])
def test_every_ticks_are_multiples_of_every_since_the_epoch(every: float | timedelta) -> None:
    s = schedule(every=every)
    assert s.every is not None
    step = s.every
    for now in (utc(2025, 3, 30, 1, 2, 3), utc(2031, 7, 4, 23, 59, 59, 999999)):
        tick = s.next_tick(now)
        assert tick is not None
        assert (tick - EPOCH) % step == timedelta(0)
        assert now < tick <= now + step


def test_every_ticks_are_the_same_whichever_host_computes_them() -> None:
    # Two hosts with different clocks and different "now"s name identical tick times,
    # which is what lets a unique (schedule, tick) row dedupe across hosts.
    s = schedule(every=7)
    host_a = list(s.ticks_between(utc(2025, 5, 1, 12, 0, 0, 123), utc(2025, 5, 1, 13)))
    host_b = list(s.ticks_between(utc(2025, 5, 1, 12, 0, 5, 999), utc(2025, 5, 1, 13, 0, 3)))
    assert host_a[1:] == host_b[: len(host_a) - 1]
    assert host_a[0] not in host_b  # host_b started after it
    assert due_ticks(s, host_a[10], host_a[11] + timedelta(seconds=2)) == due_ticks(
        s, host_a[10], host_a[11] + timedelta(seconds=6)
    )


def test_every_ignores_daylight_saving() -> None:
    s = schedule(every=3600)
    ticks = list(s.ticks_between(utc(2025, 3, 29, 23), utc(2025, 3, 30, 23)))
    assert len(ticks) == 24
    assert {t.minute for t in ticks} == {0}


def test_ticks_between_is_open_at_start_and_closed_at_end() -> None:
    s = schedule(every=60)
    ticks = list(s.ticks_between(utc(2025, 1, 1, 0, 0), utc(2025, 1, 1, 0, 3)))
    assert ticks == [utc(2025, 1, 1, 0, 1), utc(2025, 1, 1, 0, 2), utc(2025, 1, 1, 0, 3)]
    assert list(s.ticks_between(utc(2025, 1, 1, 0, 3), utc(2025, 1, 1, 0, 3))) == []


def test_next_tick_is_strictly_after_and_previous_tick_at_or_before() -> None:
    for s in (schedule(every=60), cron("* * * * *")):
        assert s.next_tick(utc(2025, 1, 1, 0, 1)) == utc(2025, 1, 1, 0, 2)
        assert s.previous_tick(utc(2025, 1, 1, 0, 1)) == utc(2025, 1, 1, 0, 1)
        assert s.previous_tick(utc(2025, 1, 1, 0, 1, 59)) == utc(2025, 1, 1, 0, 1)


def test_ticks_accept_any_aware_datetime() -> None:
    s = cron("0 3 * * *", "Europe/Berlin")
    assert s.next_tick(local("America/New_York", 2025, 6, 1)) == utc(2025, 6, 2, 1)


@pytest.mark.parametrize("method", ["next_tick", "previous_tick"])
def test_naive_datetimes_are_refused(method: str) -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        getattr(schedule(every=60), method)(datetime(2025, 1, 1))


def test_due_ticks_refuses_a_naive_now() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        due_ticks(schedule(every=60), None, datetime(2025, 1, 1))


def test_due_ticks_refuses_a_naive_last_tick() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        due_ticks(schedule(every=60), datetime(2025, 1, 1), utc(2025, 1, 1))


def test_due_ticks_refuses_a_negative_grace() -> None:
    with pytest.raises(ValueError, match="grace"):
        due_ticks(schedule(every=60), None, utc(2025, 1, 1), grace=timedelta(seconds=-1))


def test_schedule_built_directly_needs_cron_or_every() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        Schedule(name="s", task="a.b")
    with pytest.raises(ValueError, match="exactly one"):
        Schedule(name="s", task="a.b", cron="* * * * *", every=timedelta(seconds=60))


# --- due ticks: normal running ---


def nightly(**entry: object) -> Schedule:
    return cron("0 3 * * *", "Europe/Berlin", **entry)


def test_a_tick_is_due_once_it_has_come() -> None:
    s = nightly()
    last = utc(2025, 6, 1, 1)  # 03:00 Berlin summer time
    assert due_ticks(s, last, utc(2025, 6, 2, 0, 59, 59)) == []
    assert due_ticks(s, last, utc(2025, 6, 2, 1)) == [utc(2025, 6, 2, 1)]


def test_nothing_is_due_again_once_enqueued() -> None:
    s = nightly()
    assert due_ticks(s, utc(2025, 6, 2, 1), utc(2025, 6, 2, 1, 0, 5)) == []


def test_a_last_tick_ahead_of_this_hosts_clock_makes_nothing_due() -> None:
    # Another host with a fast clock already enqueued the tick this host is waiting for.
    s = schedule(every=60)
    assert due_ticks(s, utc(2025, 1, 1, 0, 2), utc(2025, 1, 1, 0, 1, 59)) == []


# --- due ticks after three days of downtime ---

DOWN_SINCE = utc(2025, 6, 1, 1)  # the last nightly tick enqueued before the outage
BACK_AT = utc(2025, 6, 4, 11)  # 13:00 Berlin, three days later


def test_missed_latest_runs_the_most_recent_missed_tick_once() -> None:
    assert due_ticks(nightly(), DOWN_SINCE, BACK_AT) == [utc(2025, 6, 4, 1)]


def test_missed_latest_is_the_default() -> None:
    assert nightly().missed == "latest"


def test_missed_all_runs_every_missed_tick_in_order() -> None:
    assert due_ticks(nightly(missed="all"), DOWN_SINCE, BACK_AT) == [
        utc(2025, 6, 2, 1),
        utc(2025, 6, 3, 1),
        utc(2025, 6, 4, 1),
    ]


def test_missed_all_is_bounded_to_the_newest_max_missed() -> None:
    s = schedule(every=60, missed="all", max_missed=5)
    ticks = due_ticks(s, DOWN_SINCE, BACK_AT)
    assert ticks == [BACK_AT - timedelta(minutes=n) for n in (4, 3, 2, 1, 0)]


def test_missed_all_default_bound_is_100() -> None:
    ticks = due_ticks(schedule(every=60, missed="all"), DOWN_SINCE, BACK_AT)
    assert len(ticks) == 100
    assert ticks[-1] == BACK_AT


def test_missed_skip_drops_late_ticks() -> None:
    assert due_ticks(nightly(missed="skip"), DOWN_SINCE, BACK_AT) == []


def test_missed_skip_still_runs_the_tick_it_is_on_time_for() -> None:
    back = utc(2025, 6, 4, 1, 0, 30)  # 30 s after today's 03:00
    assert due_ticks(nightly(missed="skip"), DOWN_SINCE, back) == [utc(2025, 6, 4, 1)]
    assert due_ticks(nightly(missed="skip"), DOWN_SINCE, back + GRACE) == []


def test_missed_skip_with_a_longer_grace() -> None:
    ticks = due_ticks(nightly(missed="skip"), DOWN_SINCE, BACK_AT, grace=timedelta(hours=11))
    assert ticks == [utc(2025, 6, 4, 1)]


def test_missed_skip_then_resumes_at_the_next_tick() -> None:
    s = nightly(missed="skip")
    assert due_ticks(s, DOWN_SINCE, utc(2025, 6, 5, 1, 0, 2)) == [utc(2025, 6, 5, 1)]


# --- schedules that have never run ---


def test_new_schedule_waits_for_its_next_tick() -> None:
    s = nightly(missed="all")  # no history: nothing to catch up, whatever the policy
    assert due_ticks(s, None, BACK_AT) == []
    assert due_ticks(s, None, utc(2025, 6, 5, 1, 0, 1)) == [utc(2025, 6, 5, 1)]


def test_new_schedule_that_appears_as_it_ticks_runs_that_tick() -> None:
    assert due_ticks(nightly(), None, utc(2025, 6, 4, 1, 0, 20)) == [utc(2025, 6, 4, 1)]


def test_new_interval_schedule_starts_with_one_tick_not_a_backlog() -> None:
    ticks = due_ticks(schedule(every=5, missed="all"), None, utc(2025, 6, 4, 1, 0, 58))
    assert ticks == [utc(2025, 6, 4, 1, 0, 55)]


# --- changed and removed schedules ---


def test_changed_expression_takes_effect_at_its_next_tick() -> None:
    ran_at_three = utc(2025, 6, 4, 1)
    four = cron("0 4 * * *", "Europe/Berlin")  # changed at 03:30
    assert due_ticks(four, ran_at_three, utc(2025, 6, 4, 1, 30)) == []
    assert due_ticks(four, ran_at_three, utc(2025, 6, 4, 2, 0, 1)) == [utc(2025, 6, 4, 2)]


def test_changed_to_an_earlier_time_waits_for_tomorrow() -> None:
    ran_at_three = utc(2025, 6, 4, 1)
    two = cron("0 2 * * *", "Europe/Berlin")
    assert due_ticks(two, ran_at_three, utc(2025, 6, 4, 23)) == []
    assert due_ticks(two, ran_at_three, utc(2025, 6, 5, 0, 0, 1)) == [utc(2025, 6, 5, 0)]


def test_changed_from_every_to_cron() -> None:
    last_interval_tick = utc(2025, 6, 4, 10, 0)
    half_past = cron("30 * * * *")
    assert due_ticks(half_past, last_interval_tick, utc(2025, 6, 4, 10, 29)) == []
    assert due_ticks(half_past, last_interval_tick, utc(2025, 6, 4, 10, 30)) == [
        utc(2025, 6, 4, 10, 30)
    ]


def test_removed_schedule_yields_nothing() -> None:
    kept = schedule("kept", every=60)
    last = {"kept": utc(2025, 1, 1, 0, 0), "removed": utc(2025, 1, 1, 0, 0)}
    ticks = collect_due_ticks([kept], last, utc(2025, 1, 1, 0, 5))
    assert ticks == [Tick(kept, utc(2025, 1, 1, 0, 5))]


def test_collect_orders_by_time_then_name() -> None:
    b = schedule("b", every=60, missed="all")
    a = schedule("a", every=120, missed="all")
    last = {"a": utc(2025, 1, 1), "b": utc(2025, 1, 1)}
    ticks = collect_due_ticks([b, a], last, utc(2025, 1, 1, 0, 4))
    assert [(t.schedule.name, t.at.minute) for t in ticks] == [
        ("b", 1),
        ("a", 2),
        ("b", 2),
        ("b", 3),
        ("a", 4),
        ("b", 4),
    ]


def test_next_wakeup_is_the_soonest_tick() -> None:
    now = utc(2025, 6, 1, 0, 59, 30)
    assert next_wakeup([nightly(), schedule(every=3600)], now) == utc(2025, 6, 1, 1)
    assert next_wakeup([], now) is None


def test_enqueue_options_leave_unset_options_to_the_defaults() -> None:
    assert schedule(every=60).enqueue_options() == {}
    s = schedule(every=60, queue="reports", priority=5, max_attempts=2, timeout=30)
    assert s.enqueue_options() == {
        "queue": "reports",
        "priority": 5,
        "max_attempts": 2,
        "timeout": 30.0,
    }


# --- many hosts, one table ---


def run_hosts(
    schedules: list[Schedule], start: datetime, end: datetime, hosts: int, seed: int
) -> list[Tick]:
    """Hosts poll at random moments; a set of (name, tick) plays the unique constraint."""
    rng = random.Random(seed)
    table: set[tuple[str, datetime]] = set()
    last: dict[str, datetime] = {}  # SELECT name, MAX(tick) ... GROUP BY name
    enqueued: list[Tick] = []
    clocks = [start + timedelta(seconds=rng.uniform(0, 30)) for _ in range(hosts)]
    while min(clocks) < end:
        host = clocks.index(min(clocks))
        now = clocks[host]
        for tick in collect_due_ticks(schedules, dict(last), now):
            key = (tick.schedule.name, tick.at)
            if key not in table:  # INSERT ... would raise IntegrityError otherwise
                table.add(key)
                last[key[0]] = max(tick.at, last.get(key[0], tick.at))
                enqueued.append(tick)
        clocks[host] = now + timedelta(seconds=rng.uniform(1, 40))
    return enqueued


@pytest.mark.parametrize(
    ("zone", "spring", "fall"),
    [
        ("Europe/Berlin", date(2025, 3, 30), date(2025, 10, 26)),
        ("America/New_York", date(2025, 3, 9), date(2025, 11, 2)),
    ],
)
def test_three_hosts_enqueue_each_tick_once_across_dst_days(
    zone: str, spring: date, fall: date
) -> None:
    schedules = [
        cron("30 2 * * *", zone, name="daily-0230"),
        cron("30 1 * * *", zone, name="daily-0130"),
        cron("0 * * * *", zone, name="hourly"),
        schedule("every-5-min", every=300),
    ]
    for day in (spring, fall):
        start = datetime(day.year, day.month, day.day, tzinfo=UTC) - timedelta(days=1)
        enqueued = run_hosts(schedules, start, start + timedelta(days=3), hosts=3, seed=day.day)
        keys = [(t.schedule.name, t.at) for t in enqueued]
        assert len(keys) == len(set(keys))
        per_day: Counter[tuple[str, date]] = Counter(
            (t.schedule.name, t.at.astimezone(t.schedule.timezone).date()) for t in enqueued
        )
        assert per_day[("daily-0230", day)] == 1
        assert per_day[("daily-0130", day)] == 1
        assert per_day[("hourly", day)] == (23 if day == spring else 25)
        every = sorted(t.at for t in enqueued if t.schedule.name == "every-5-min")
        assert {b - a for a, b in itertools.pairwise(every)} == {timedelta(minutes=5)}
