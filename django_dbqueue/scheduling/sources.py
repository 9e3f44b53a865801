"""Where the recurring schedules come from: ``DBQUEUE['SCHEDULE']`` and the
``@job(schedule=...)`` declarations in the task registry, merged under unique names."""

from __future__ import annotations

from django_dbqueue import registry
from django_dbqueue.exceptions import ScheduleError
from django_dbqueue.scheduling.config import (
    clash_message,
    default_timezone,
    parse_schedule,
    schedules_from_settings,
)
from django_dbqueue.scheduling.recurring import Schedule


def all_schedules() -> list[Schedule]:
    """The schedules of ``DBQUEUE['SCHEDULE']``, then those declared with
    ``@job(schedule=...)`` (the task modules are imported first). ScheduleError for the
    first bad entry, or a name declared twice."""
    registry.discover()
    zone = default_timezone()
    schedules = schedules_from_settings()
    taken = {schedule.name: "DBQUEUE['SCHEDULE']" for schedule in schedules}
    for path, name, entry in registry.declared_schedules():
        where = f"@job(schedule=...) on {path}"
        if name in taken:
            raise ScheduleError(name, clash_message(name, taken[name]), None, where)
        taken[name] = where
        schedules.append(parse_schedule(name, entry, default_timezone=zone))
    return schedules
