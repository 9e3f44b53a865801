"""Cron expressions: the syntax cronsim documents, @aliases, and daylight-saving days."""

from __future__ import annotations

import itertools
from datetime import UTC, date, timedelta

import pytest

from django_dbqueue.exceptions import ScheduleError
from tests.scheduling.helpers import cron, local, ticks_on_local_days, utc

# Pure computation: the same on every database, so only the SQLite run has it.
pytestmark = pytest.mark.only_vendor("sqlite")


def first_ticks(expression: str, count: int, after: tuple[int, ...] = (2025, 1, 1)) -> list[str]:
    s = cron(expression)
    ticks, at = [], utc(*after)
    for _ in range(count):
        tick = s.next_tick(at)
        assert tick is not None
        ticks.append(tick.strftime("%Y-%m-%d %H:%M %a"))
        at = tick
    return ticks


# 2025-01-01 is a Wednesday.


def test_hourly_alias() -> None:
    assert first_ticks("@hourly", 3) == [
        "2025-01-01 01:00 Wed",
        "2025-01-01 02:00 Wed",
        "2025-01-01 03:00 Wed",
    ]


@pytest.mark.parametrize("alias", ["@daily", "@midnight", "@DAILY"])
def test_daily_aliases(alias: str) -> None:
    assert first_ticks(alias, 2) == ["2025-01-02 00:00 Thu", "2025-01-03 00:00 Fri"]


def test_weekly_alias_is_sunday_midnight() -> None:
    assert first_ticks("@weekly", 2) == ["2025-01-05 00:00 Sun", "2025-01-12 00:00 Sun"]


def test_monthly_alias() -> None:
    assert first_ticks("@monthly", 2) == ["2025-02-01 00:00 Sat", "2025-03-01 00:00 Sat"]


@pytest.mark.parametrize("alias", ["@yearly", "@annually"])
def test_yearly_aliases(alias: str) -> None:
    assert first_ticks(alias, 2) == ["2026-01-01 00:00 Thu", "2027-01-01 00:00 Fri"]


def test_day_of_month_and_day_of_week_both_restricted_means_either() -> None:
    # Vixie/Debian cron: with both fields restricted a day matches if either does.
    ticks = first_ticks("0 0 13 * FRI", 5)
    assert ticks == [
        "2025-01-03 00:00 Fri",
        "2025-01-10 00:00 Fri",
        "2025-01-13 00:00 Mon",
        "2025-01-17 00:00 Fri",
        "2025-01-24 00:00 Fri",
    ]


def test_day_field_starting_with_star_means_both() -> None:
    # Debian cron's quirk, which cronsim copies: "*/10" starts with "*", so both fields
    # must match: days 1, 11, 21, 31 that are also Fridays.
    assert first_ticks("0 0 */10 * FRI", 3) == [
        "2025-01-31 00:00 Fri",
        "2025-02-21 00:00 Fri",
        "2025-03-21 00:00 Fri",
    ]


def test_ranges_of_hours_and_weekdays() -> None:
    s = cron("0 9-17 * * MON-FRI")
    ticks = list(s.ticks_between(utc(2025, 1, 5), utc(2025, 1, 12)))  # Sunday to Sunday
    assert len(ticks) == 5 * 9
    assert {t.hour for t in ticks} == set(range(9, 18))
    assert {t.strftime("%a") for t in ticks} == {"Mon", "Tue", "Wed", "Thu", "Fri"}


def test_steps() -> None:
    assert first_ticks("*/15 * * * *", 5) == [
        "2025-01-01 00:15 Wed",
        "2025-01-01 00:30 Wed",
        "2025-01-01 00:45 Wed",
        "2025-01-01 01:00 Wed",
        "2025-01-01 01:15 Wed",
    ]
    assert [t[11:16] for t in first_ticks("0 0-12/6 * * *", 3)] == ["06:00", "12:00", "00:00"]


def test_lists_and_month_names() -> None:
    assert first_ticks("30 8 1,15 JAN,JUL *", 4) == [
        "2025-01-01 08:30 Wed",
        "2025-01-15 08:30 Wed",
        "2025-07-01 08:30 Tue",
        "2025-07-15 08:30 Tue",
    ]


@pytest.mark.parametrize("sunday", ["0", "7", "SUN", "sun"])
def test_sunday_spellings(sunday: str) -> None:
    assert first_ticks(f"0 12 * * {sunday}", 1) == ["2025-01-05 12:00 Sun"]


def test_last_day_of_month() -> None:
    assert first_ticks("0 0 L * *", 3, after=(2024, 1, 31)) == [
        "2024-02-29 00:00 Thu",
        "2024-03-31 00:00 Sun",
        "2024-04-30 00:00 Tue",
    ]


def test_last_weekday_of_month() -> None:
    # May 2025 ends on a Saturday: its last weekday is Friday the 30th.
    assert first_ticks("0 0 LW 5 *", 1) == ["2025-05-30 00:00 Fri"]


def test_last_friday_and_nth_monday() -> None:
    assert first_ticks("0 0 * * 5L", 1) == ["2025-01-31 00:00 Fri"]
    assert first_ticks("0 0 * * MON#1", 2) == ["2025-01-06 00:00 Mon", "2025-02-03 00:00 Mon"]


def test_extra_whitespace_is_ignored() -> None:
    assert first_ticks("  0   3 * *\t* ", 1) == ["2025-01-01 03:00 Wed"]


def test_leap_day_expression_is_valid() -> None:
    assert first_ticks("0 0 29 2 *", 1) == ["2028-02-29 00:00 Tue"]


@pytest.mark.parametrize(
    "expression",
    [
        "",
        "   ",
        "61 * * * *",
        "* 24 * * *",
        "* * 0 * *",
        "* * 32 * *",
        "* * * 13 *",
        "* * * * 8",
        "*/0 * * * *",
        "5-1 * * * *",
        "0 0 * *",
        "0 0 0 * * *",  # cronsim's seconds field: refused, see cron.expand
        "0 0 * * * * *",
        "0 0 30 2 *",
        "0 0 31 4,6 *",
        "0 0 * * MON#6",
        "0 0 * * FOO",
        "a b c d e",
        "0 0 ¹ * *",
        "@reboot",
        "@fortnightly",
        "@",
    ],
)
def test_invalid_expression_is_refused(expression: str) -> None:
    with pytest.raises(ScheduleError) as info:
        cron(expression)
    assert info.value.name == "s"
    assert info.value.field == "cron"


def test_cron_must_be_a_string() -> None:
    with pytest.raises(ScheduleError, match="'cron' must be a string"):
        cron(300)  # type: ignore[arg-type]


# Daylight-saving days: a fixed-time daily job runs once on each local day.
DST_DAYS = [
    ("Europe/Berlin", date(2025, 3, 30), date(2025, 10, 26)),
    ("America/New_York", date(2025, 3, 9), date(2025, 11, 2)),
]


@pytest.mark.parametrize(("zone", "spring", "fall"), DST_DAYS)
@pytest.mark.parametrize("expression", ["30 2 * * *", "30 1 * * *", "0 3 * * *", "0 0 * * *"])
def test_daily_job_runs_once_on_every_local_day_of_a_year(
    zone: str, spring: date, fall: date, expression: str
) -> None:
    counts = ticks_on_local_days(cron(expression, zone), date(2025, 1, 1), date(2025, 12, 31))
    assert len(counts) == 365
    assert set(counts.values()) == {1}
    assert counts[spring] == counts[fall] == 1


def test_spring_forward_runs_a_skipped_time_at_the_end_of_the_gap_berlin() -> None:
    # 2025-03-30: Berlin clocks jump from 02:00 to 03:00; 02:30 does not exist.
    s = cron("30 2 * * *", "Europe/Berlin")
    ticks = list(s.ticks_between(utc(2025, 3, 29), utc(2025, 4, 1)))
    assert [t.astimezone(s.timezone).isoformat() for t in ticks] == [
        "2025-03-29T02:30:00+01:00",
        "2025-03-30T03:00:00+02:00",
        "2025-03-31T02:30:00+02:00",
    ]


def test_spring_forward_new_york() -> None:
    s = cron("30 2 * * *", "America/New_York")
    ticks = list(s.ticks_between(utc(2025, 3, 9), utc(2025, 3, 10)))
    assert [t.astimezone(s.timezone).isoformat() for t in ticks] == ["2025-03-09T03:00:00-04:00"]


def test_fall_back_runs_a_repeated_time_once_at_its_first_pass_berlin() -> None:
    # 2025-10-26: Berlin clocks go from 03:00 back to 02:00; 02:30 happens twice.
    s = cron("30 2 * * *", "Europe/Berlin")
    ticks = list(s.ticks_between(utc(2025, 10, 25, 12), utc(2025, 10, 27, 12)))
    assert [t.isoformat() for t in ticks] == [
        "2025-10-26T00:30:00+00:00",  # 02:30 summer time
        "2025-10-27T01:30:00+00:00",
    ]


def test_fall_back_new_york_0130_runs_once() -> None:
    # 2025-11-02: New York repeats 01:00-02:00.
    s = cron("30 1 * * *", "America/New_York")
    ticks = list(s.ticks_between(utc(2025, 11, 2), utc(2025, 11, 3)))
    assert [t.astimezone(s.timezone).isoformat() for t in ticks] == ["2025-11-02T01:30:00-04:00"]


def test_next_tick_from_the_second_pass_of_a_repeated_hour_moves_forward() -> None:
    # At 02:15 of the second pass, today's 02:30 (first pass) is already behind us.
    s = cron("30 2 * * *", "Europe/Berlin")
    second_pass = local("Europe/Berlin", 2025, 10, 26, 2, 15).replace(fold=1)
    assert s.next_tick(second_pass) == utc(2025, 10, 27, 1, 30)


@pytest.mark.parametrize(
    ("zone", "spring", "fall"),
    DST_DAYS,
)
def test_hourly_job_follows_elapsed_hours(zone: str, spring: date, fall: date) -> None:
    # An hourly job counts real hours: 23 on the short day, 25 on the long one,
    # never two within an hour and never a gap of more than one.
    s = cron("0 * * * *", zone)
    counts = ticks_on_local_days(s, spring, spring)
    assert counts[spring] == 23
    assert ticks_on_local_days(s, fall, fall)[fall] == 25
    ticks = list(s.ticks_between(utc(fall.year, 1, 1), utc(fall.year, 12, 31)))
    assert {b - a for a, b in itertools.pairwise(ticks)} == {timedelta(hours=1)}


def test_minute_step_inside_the_skipped_hour_does_not_run_that_day() -> None:
    # Documented exception: only fixed-time expressions are moved out of a gap; with a
    # '*' in the minute or hour field cron counts elapsed time, and 02:xx never happens.
    counts = ticks_on_local_days(
        cron("*/20 2 * * *", "Europe/Berlin"), date(2025, 3, 29), date(2025, 3, 31)
    )
    assert counts == {date(2025, 3, 29): 3, date(2025, 3, 31): 3}


@pytest.mark.parametrize(
    ("zone", "day"),
    [
        ("Europe/Berlin", date(2025, 3, 30)),
        ("Europe/Berlin", date(2025, 10, 26)),
        ("America/New_York", date(2025, 3, 9)),
        ("America/New_York", date(2025, 11, 2)),
        ("Australia/Lord_Howe", date(2025, 4, 6)),  # a half-hour change
    ],
)
@pytest.mark.parametrize(
    "expression", ["30 2 * * *", "30 1 * * *", "0 * * * *", "*/20 * * * *", "0 1-3 * * *"]
)
def test_previous_tick_agrees_with_walking_forward(zone: str, day: date, expression: str) -> None:
    # Every host must name the same ticks whichever way it looks for them.
    s = cron(expression, zone)
    start = utc(day.year, day.month, day.day) - timedelta(days=1)
    ticks = list(s.ticks_between(start, start + timedelta(days=3)))
    assert ticks == sorted(set(ticks))
    stepped, at = [], start
    while (following := s.next_tick(at)) is not None and following <= ticks[-1]:
        stepped.append(following)
        at = following
    assert stepped == ticks
    for tick, after in zip(ticks, [*ticks[1:], None], strict=True):
        assert s.previous_tick(tick) == tick
        if after is not None:
            assert s.previous_tick(after - timedelta(microseconds=1)) == tick
            assert s.previous_tick(tick + (after - tick) / 2) == tick


def test_ticks_are_utc() -> None:
    tick = cron("0 3 * * *", "Europe/Berlin").next_tick(utc(2025, 6, 1))
    assert tick == utc(2025, 6, 1, 1)
    assert tick is not None and tick.tzinfo is UTC
