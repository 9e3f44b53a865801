"""Shared builders for the scheduling tests."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from django_dbqueue.scheduling.config import parse_schedule
from django_dbqueue.scheduling.recurring import Schedule


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


def local(zone: str, *parts: int) -> datetime:
    return datetime(*parts, tzinfo=ZoneInfo(zone))  # type: ignore[misc]


def schedule(name: str = "s", **entry: Any) -> Schedule:
    entry.setdefault("task", "tests.jobs.add")
    return parse_schedule(name, entry)


def cron(expression: str, zone: str = "UTC", **entry: Any) -> Schedule:
    return schedule(cron=expression, timezone=zone, **entry)


def ticks_on_local_days(s: Schedule, first: date, last: date) -> Counter[date]:
    """How many ticks fall on each local calendar day from ``first`` to ``last``."""
    zone = s.timezone
    start = datetime.combine(first, datetime.min.time(), tzinfo=zone) - timedelta(microseconds=1)
    end = datetime.combine(last + timedelta(days=1), datetime.min.time(), tzinfo=zone)
    counts: Counter[date] = Counter()
    for tick in s.ticks_between(start, end - timedelta(microseconds=1)):
        counts[tick.astimezone(zone).date()] += 1
    return counts
