"""``DBQUEUE['SCHEDULE']`` turned into :class:`Schedule` objects, every mistake named.

Each entry is checked on its own, so the system check can report all bad entries at
once; :func:`parse_schedules` stops at the first.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, TypeGuard
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from django_dbqueue import bounds
from django_dbqueue.conf import settings
from django_dbqueue.exceptions import ScheduleError
from django_dbqueue.scheduling.recurring import (
    EVERY_RANGE,
    MAX_EVERY,
    MIN_EVERY,
    MISSED_POLICIES,
    UTC_ZONE,
    Schedule,
)

KEYS = (
    "task",
    "cron",
    "every",
    "timezone",
    "args",
    "kwargs",
    "queue",
    "priority",
    "max_attempts",
    "timeout",
    "missed",
    "max_missed",
)
NAME_MAX = 100  # names are stored with each tick row
# As enqueue() bounds them.
QUEUE_MAX = bounds.QUEUE_NAME_MAX
PRIORITY_RANGE = bounds.PRIORITY_RANGE


def schedules_from_settings() -> list[Schedule]:
    """The schedules of ``DBQUEUE['SCHEDULE']``; ScheduleError for the first bad entry.

    Cron expressions without a ``timezone`` are read in Django's ``TIME_ZONE``.
    """
    return parse_schedules(settings.SCHEDULE, default_timezone=default_timezone())


def declared_entry(path: str, given: Any) -> tuple[str, dict[str, Any]]:
    """One ``@job(schedule=...)`` entry of the task ``path`` as (name, settings entry),
    checked as a settings entry is; ScheduleError saying where it was declared."""
    where = f"@job(schedule=...) on {path}"
    if not isinstance(given, Mapping):
        raise ScheduleError(
            path,
            f"schedule must be a dict such as {{'cron': '0 3 * * *'}}, not {given!r}.",
            None,
            where,
        )
    entry = dict(given)
    name = entry.pop("name", path)
    if "task" in entry:
        raise ScheduleError(name, "'task' is the decorated function: leave it out.", "task", where)
    entry["task"] = path
    try:
        parse_schedule(name, entry)
    except ScheduleError as exc:
        raise ScheduleError(exc.name, exc.message, exc.field, where) from None
    return name, entry


def clash_message(name: str, other: str) -> str:
    return (
        f"the schedule name {name!r} is taken by {other}: schedule names are unique (each "
        "tick is recorded under its schedule's name). Rename one ('name' in the decorator)."
    )


def default_timezone() -> str:
    from django.conf import settings as django_settings

    return getattr(django_settings, "TIME_ZONE", None) or "UTC"


def parse_schedules(raw: Any, *, default_timezone: str = "UTC") -> list[Schedule]:
    """Every entry of a ``{name: {...}}`` dict as a Schedule, in the dict's order."""
    if not isinstance(raw, Mapping):
        raise ScheduleError(None, f"must be a dict of name -> entry, not {type(raw).__name__}.")
    return [
        parse_schedule(name, entry, default_timezone=default_timezone)
        for name, entry in raw.items()
    ]


def parse_schedule(name: Any, entry: Any, *, default_timezone: str = "UTC") -> Schedule:
    """One settings entry as a Schedule; ScheduleError saying what is wrong with it."""
    task = _checked_shape(name, entry)
    timing = _timing(name, entry, default_timezone)
    try:
        return Schedule(
            name=name,
            task=task,
            args=tuple(_json(name, entry, "args", list | tuple, [])),
            kwargs=_json(name, entry, "kwargs", dict, {}),
            queue=_queue(name, entry.get("queue")),
            priority=_integer(name, entry, "priority", *PRIORITY_RANGE),
            max_attempts=_integer(name, entry, "max_attempts", 1, None),
            timeout=_timeout(name, entry.get("timeout")),
            **timing,
        )
    except ValueError as exc:
        if isinstance(exc, ScheduleError):
            raise
        raise ScheduleError(name, str(exc), "cron" if "cron" in entry else "every") from None


def _checked_shape(name: Any, entry: Any) -> str:
    """The name, the entry's keys and its task path checked; returns the task path."""
    if not isinstance(name, str) or not name.strip() or len(name) > NAME_MAX:
        raise ScheduleError(
            name, f"a schedule name must be a non-blank string of 1-{NAME_MAX} characters."
        )
    if not isinstance(entry, Mapping):
        raise ScheduleError(
            name,
            f"must be a dict such as {{'task': 'app.jobs.func', 'cron': '0 3 * * *'}}, "
            f"not {type(entry).__name__}.",
        )
    for key in entry:
        if key not in KEYS:
            close = difflib.get_close_matches(str(key), KEYS, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ScheduleError(
                name, f"unknown key {key!r}.{hint} Valid keys: {', '.join(KEYS)}.", str(key)
            )
    task = entry.get("task")
    if not is_dotted_path(task):
        raise ScheduleError(
            name,
            f"'task' must be a dotted path such as 'myapp.jobs.send_report', not {task!r}.",
            "task",
        )
    return task


def _timing(name: str, entry: Mapping[str, Any], default_timezone: str) -> dict[str, Any]:
    """When the schedule ticks: cron and zone, or every; missed and max_missed."""
    if ("cron" in entry) == ("every" in entry):
        which = "both 'cron' and 'every'" if "cron" in entry else "neither 'cron' nor 'every'"
        raise ScheduleError(
            name,
            f"has {which}: give a cron expression ('cron': '0 3 * * *') or "
            "a number of seconds ('every': 300).",
        )
    timing: dict[str, Any] = {}
    if "cron" in entry:
        expression = entry["cron"]
        if not isinstance(expression, str):
            raise ScheduleError(name, f"'cron' must be a string, not {expression!r}.", "cron")
        timing["cron"] = expression
        timing["timezone"] = _zone(name, entry.get("timezone", default_timezone))
    else:
        if "timezone" in entry:
            raise ScheduleError(
                name,
                "'timezone' applies to 'cron' only: 'every' ticks count seconds since the Unix "
                "epoch, the same everywhere.",
                "timezone",
            )
        timing["every"] = _every(name, entry["every"])
    missed = entry.get("missed", "latest")
    if missed not in MISSED_POLICIES:
        close = difflib.get_close_matches(str(missed), MISSED_POLICIES, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ScheduleError(
            name,
            f"'missed' must be one of {', '.join(MISSED_POLICIES)}, not {missed!r}.{hint}",
            "missed",
        )
    if "max_missed" in entry:
        if missed != "all":
            raise ScheduleError(
                name, "'max_missed' bounds the catch-up of 'missed': 'all' only.", "max_missed"
            )
        max_missed = _integer(name, entry, "max_missed", 1, None)
        if max_missed is None:
            raise ScheduleError(
                name, "'max_missed' must be an integer of at least 1.", "max_missed"
            )
        timing["max_missed"] = max_missed
    timing["missed"] = missed
    return timing


def is_dotted_path(value: Any) -> TypeGuard[str]:
    return (
        isinstance(value, str)
        and "." in value
        and all(part.isidentifier() for part in value.split("."))
    )


def _zone(name: str, value: Any) -> ZoneInfo:
    if isinstance(value, ZoneInfo):
        return value
    if not isinstance(value, str):
        raise ScheduleError(
            name,
            f"'timezone' must be a zone name such as 'Europe/Berlin', not {value!r}.",
            "timezone",
        )
    if value == "UTC":
        return UTC_ZONE
    try:
        return ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        pass
    known = available_timezones()
    close = [zone for zone in known if zone.lower() == value.lower()]
    close = close or difflib.get_close_matches(value, known, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ScheduleError(name, f"unknown time zone {value!r}.{hint}", "timezone")


def _every(name: str, value: Any) -> timedelta:
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise ScheduleError(
            name, f"'every' must be a number of seconds or a timedelta, not {value!r}.", "every"
        )
    if not math.isfinite(seconds) or not (
        MIN_EVERY.total_seconds() <= seconds <= MAX_EVERY.total_seconds()
    ):
        raise ScheduleError(
            name,
            f"'every' must be {EVERY_RANGE}, not {value!r}.",
            "every",
        )
    return value if isinstance(value, timedelta) else timedelta(seconds=seconds)


def _json(name: str, entry: Mapping[str, Any], key: str, kind: Any, default: Any) -> Any:
    value = entry.get(key, default)
    if not isinstance(value, kind):
        wanted = "a list" if key == "args" else "a dict"
        raise ScheduleError(name, f"{key!r} must be {wanted}, not {value!r}.", key)
    if key == "kwargs" and not all(isinstance(k, str) for k in value):
        raise ScheduleError(name, "'kwargs' keys must be strings.", key)
    try:
        # What a worker receives is what JSON keeps; refuse what it would change or lose.
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ScheduleError(
            name,
            f"{key!r} must hold JSON values only (str, int, float, bool, None, list, dict): {exc}.",
            key,
        ) from None


def _queue(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > QUEUE_MAX:
        raise ScheduleError(
            name,
            f"'queue' must be a queue name of 1-{QUEUE_MAX} characters, not {value!r}.",
            "queue",
        )
    return value


def _integer(
    name: str, entry: Mapping[str, Any], key: str, low: int, high: int | None
) -> int | None:
    value = entry.get(key)
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < low
        or (high is not None and value > high)
    ):
        limits = f"at least {low}" if high is None else f"between {low} and {high}"
        raise ScheduleError(name, f"{key!r} must be an integer {limits}, not {value!r}.", key)
    return value


def _timeout(name: str, value: Any) -> float | None:
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ScheduleError(
            name, f"'timeout' must be a positive number of seconds, not {value!r}.", "timeout"
        )
    return float(value)
