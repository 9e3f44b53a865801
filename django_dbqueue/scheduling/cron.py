"""Cron expressions: @aliases, validation, and tick times in a time zone.

cronsim does the matching because it follows Debian cron on daylight-saving days, which
is what "a daily job neither skips nor doubles" needs (docs/scheduling.md says how it
was chosen). This module adds what it leaves out (the @aliases) and turns its local
times into UTC, the only form in which hosts compare ticks.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo

from cronsim import CronSim, CronSimError

ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
FIELDS = "minute hour day-of-month month day-of-week"
# Validation asks for one match after a fixed instant, so every host judges alike.
REFERENCE = datetime(2000, 1, 1, tzinfo=UTC)
SECOND = timedelta(seconds=1)


def expand(expression: str) -> str:
    """The five-field form of ``expression``; ValueError saying what is wrong with it."""
    text = " ".join(expression.split())
    if text.startswith("@"):
        if text.lower() == "@reboot":
            raise ValueError("@reboot has no meaning for a queue; use a time-based expression.")
        try:
            return ALIASES[text.lower()]
        except KeyError:
            raise ValueError(
                f"unknown alias {text!r}; known: {', '.join(sorted(set(ALIASES)))}."
            ) from None
    fields = text.split(" ")
    if len(fields) != 5:
        # cronsim also takes a leading seconds field, but then drops its Debian
        # daylight-saving handling; whole minutes are plenty for a queue.
        raise ValueError(
            f"{expression!r} has {len(fields) if text else 0} fields; a cron expression has "
            f"5 ({FIELDS}) or is one of {', '.join(sorted(set(ALIASES)))}."
        )
    try:
        CronSim(text, REFERENCE)
    except CronSimError as exc:
        raise ValueError(f"{expression!r} is not a valid cron expression: {exc}.") from None
    if next_after(text, ZoneInfo("UTC"), REFERENCE) is None:
        raise ValueError(f"{expression!r} matches no date.")
    return text


def ticks_after(expression: str, zone: ZoneInfo, after: datetime) -> Iterator[datetime]:
    """The ticks strictly after ``after`` (aware), in UTC, ascending; ends after 50 idle years."""
    last = after
    for local in CronSim(expression, after.astimezone(zone)):
        tick = local.astimezone(UTC)
        # On a fall-back day cronsim counts wall-clock time, so from the second pass
        # through the repeated hour it can name the first pass again: already past.
        if tick > last:
            last = tick
            yield tick


def next_after(expression: str, zone: ZoneInfo, after: datetime) -> datetime | None:
    """The first tick strictly after ``after`` (aware), in UTC; None if none in 50 years."""
    # In UTC because aware datetimes of one zone compare equal across a fall-back fold,
    # which would let the cache answer for the wrong pass through the repeated hour.
    return _next_after_utc(expression, zone, after.astimezone(UTC))


@lru_cache(maxsize=4096)
def _next_after_utc(expression: str, zone: ZoneInfo, after: datetime) -> datetime | None:
    # A worker asks this on every pass, for the same last tick, until the next one comes.
    return next(ticks_after(expression, zone, after), None)


def latest_at(expression: str, zone: ZoneInfo, at: datetime) -> datetime | None:
    """The last tick at or before ``at`` (aware), in UTC; None if none in 50 years.

    The ticks are those of :func:`next_after`. cronsim walks backwards by separate code
    (its own daylight-saving steps), so its answer is only a candidate: confirmed by
    walking forwards and moved on to the last forward tick not after ``at``. Then a
    difference between its two directions cannot make two hosts name different ticks.
    """
    # Reverse iteration yields times before its start; add the second in UTC, where a
    # fall-back day's repeated hour cannot make it an hour.
    start = (at.astimezone(UTC).replace(microsecond=0) + SECOND).astimezone(zone)
    for local in CronSim(expression, start, reverse=True):
        tick = local.astimezone(UTC)
        if tick > at or next_after(expression, zone, tick - SECOND) != tick:
            continue
        while (following := next_after(expression, zone, tick)) is not None and following <= at:
            tick = following
        return tick
    return None
