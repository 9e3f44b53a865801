"""Recurring schedules: their tick times, and which ticks are due (docs/scheduling.md).

Everything here is pure: given the same settings, the same last tick and the same
``now``, every host computes the same tick times, so the database can keep one row per
(schedule name, tick) and let a unique constraint decide which host enqueues it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import count
from typing import Any, Literal
from zoneinfo import ZoneInfo

from django_dbqueue.scheduling import cron

MissedPolicy = Literal["latest", "all", "skip"]
MISSED_POLICIES: tuple[MissedPolicy, ...] = ("latest", "all", "skip")
DEFAULT_MAX_MISSED = 100
# A tick this late still counts as on time for "skip" and for a schedule that has never
# run. It must exceed the longest gap between two scheduler passes of a healthy worker.
GRACE = timedelta(seconds=60)
# Interval ticks sit at whole multiples of ``every`` since the Unix epoch: a point all
# hosts share without talking to each other.
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MICROSECOND = timedelta(microseconds=1)
MIN_EVERY = timedelta(seconds=1)  # each tick is a row and a job: faster belongs in a loop
MAX_EVERY = timedelta(days=366)  # beyond a year, say which day with cron
EVERY_RANGE = "from 1 second to 366 days (31622400 seconds)"
UTC_ZONE = ZoneInfo("UTC")


@dataclass(frozen=True)
class Schedule:
    """One recurring job: what to enqueue, and when (``cron`` in ``timezone``, or ``every``).

    Build it with :func:`django_dbqueue.scheduling.config.parse_schedule` to get every
    field checked; constructing it directly checks only the timing.
    """

    name: str
    task: str
    cron: str | None = None
    every: timedelta | None = None
    timezone: ZoneInfo = UTC_ZONE
    args: tuple[Any, ...] = field(default=(), hash=False)
    kwargs: Mapping[str, Any] = field(default_factory=dict, hash=False)
    queue: str | None = None  # None: the task's own default, then DBQUEUE['DEFAULT_QUEUE']
    priority: int | None = None
    max_attempts: int | None = None
    timeout: float | None = None
    missed: MissedPolicy = "latest"
    max_missed: int = DEFAULT_MAX_MISSED  # how many missed ticks "all" catches up at most
    expression: str = field(init=False, default="", compare=False, repr=False)

    def __post_init__(self) -> None:
        if (self.cron is None) == (self.every is None):
            raise ValueError("give exactly one of 'cron' and 'every'.")
        if self.cron is not None:
            object.__setattr__(self, "expression", cron.expand(self.cron))
        elif self.every is not None and not MIN_EVERY <= self.every <= MAX_EVERY:
            raise ValueError(f"'every' must be {EVERY_RANGE}.")
        if self.missed not in MISSED_POLICIES:
            raise ValueError(f"'missed' must be one of {', '.join(MISSED_POLICIES)}.")
        if self.max_missed < 1:
            raise ValueError("'max_missed' must be at least 1.")

    def next_tick(self, after: datetime) -> datetime | None:
        """The first tick strictly after ``after``, in UTC (None: a cron expression that
        matches nothing in the next 50 years)."""
        after = aware(after, "after")
        if self.every is None:
            return cron.next_after(self.expression, self.timezone, after)
        return EPOCH + self.every * ((after - EPOCH) // self.every + 1)

    def previous_tick(self, at: datetime) -> datetime | None:
        """The last tick at or before ``at``, in UTC."""
        at = aware(at, "at")
        if self.every is None:
            return cron.latest_at(self.expression, self.timezone, at)
        return EPOCH + self.every * ((at - EPOCH) // self.every)

    def ticks_between(self, start: datetime, end: datetime) -> Iterator[datetime]:
        """The ticks in ``(start, end]``, ascending, in UTC."""
        start, end = aware(start, "start"), aware(end, "end")
        if self.every is None:
            ticks = cron.ticks_after(self.expression, self.timezone, start)
        else:
            ticks = (EPOCH + self.every * k for k in count((start - EPOCH) // self.every + 1))
        for tick in ticks:
            if tick > end:
                return
            yield tick

    def enqueue_options(self) -> dict[str, Any]:
        """Keyword arguments for ``enqueue()`` besides task, args and kwargs; options left
        unset are left out, so the task's and the settings' defaults apply."""
        options = {
            "queue": self.queue,
            "priority": self.priority,
            "max_attempts": self.max_attempts,
            "timeout": self.timeout,
        }
        return {key: value for key, value in options.items() if value is not None}


@dataclass(frozen=True)
class Tick:
    """A due tick: enqueue ``schedule``'s job once for time ``at`` (UTC)."""

    schedule: Schedule
    at: datetime


def due_ticks(
    schedule: Schedule, last_tick: datetime | None, now: datetime, *, grace: timedelta = GRACE
) -> list[datetime]:
    """The ticks of ``schedule`` to enqueue now, ascending.

    ``last_tick`` is the newest tick already enqueued for this schedule's name (by any
    host, under any earlier expression), None if there is none. Ticks in
    ``(last_tick, now]`` are due; the newest due tick is the current one and the rest
    were missed, which ``schedule.missed`` decides about:

    - "latest" (default): only the newest due tick: after downtime, the job runs once.
    - "all": every due tick, but no more than the ``max_missed`` newest (older are dropped).
    - "skip": the newest due tick only if it is at most ``grace`` old; a late one is
      dropped too and the schedule waits for its next tick.

    A schedule that has never run starts like "skip": its newest tick if that came due
    within ``grace`` (it appeared just as it ticked), otherwise nothing until its next tick.
    """
    now = aware(now, "now")
    if last_tick is not None:
        last_tick = aware(last_tick, "last_tick")
    if grace < timedelta(0):
        raise ValueError("grace must not be negative.")
    if last_tick is not None:
        # The usual answer, found cheaply: the tick after the last one has not come yet.
        following = schedule.next_tick(last_tick)
        if following is None or following > now:
            return []
    newest = schedule.previous_tick(now)
    if newest is None or (last_tick is not None and newest <= last_tick):
        return []
    if last_tick is None or schedule.missed == "skip":
        return [newest] if now - newest <= grace else []
    if schedule.missed == "latest":
        return [newest]
    ticks = [newest]
    while len(ticks) < schedule.max_missed:
        earlier = schedule.previous_tick(ticks[-1] - MICROSECOND)
        if earlier is None or earlier <= last_tick:
            break
        ticks.append(earlier)
    return ticks[::-1]


def collect_due_ticks(
    schedules: Iterable[Schedule],
    last_ticks: Mapping[str, datetime],
    now: datetime,
    *,
    grace: timedelta = GRACE,
) -> list[Tick]:
    """Every due tick of ``schedules``, by time then name.

    ``last_ticks`` maps schedule names to their newest enqueued tick; names that are no
    longer scheduled are ignored, so a schedule removed from the settings stops.
    """
    ticks = [
        Tick(schedule, at)
        for schedule in schedules
        for at in due_ticks(schedule, last_ticks.get(schedule.name), now, grace=grace)
    ]
    return sorted(ticks, key=lambda tick: (tick.at, tick.schedule.name))


def next_wakeup(schedules: Iterable[Schedule], now: datetime) -> datetime | None:
    """When the next tick of any of ``schedules`` comes due (None: no schedule ticks)."""
    upcoming = [tick for s in schedules if (tick := s.next_tick(now)) is not None]
    return min(upcoming, default=None)


def aware(value: datetime, what: str) -> datetime:
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise ValueError(f"{what} must be a timezone-aware datetime, not {value!r}.")
    return value
