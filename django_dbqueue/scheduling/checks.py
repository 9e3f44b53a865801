"""System checks for ``DBQUEUE['SCHEDULE']``: every bad entry reported by name.

Not registered here: the app's checks module does that, handing over the task registry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core import checks

from django_dbqueue.conf import settings
from django_dbqueue.exceptions import ScheduleError
from django_dbqueue.scheduling.config import default_timezone, is_dotted_path, parse_schedule

# Which check id a ScheduleError gets, by the key it is about (others: E302).
FIELD_IDS = {
    "cron": "django_dbqueue.E303",
    "every": "django_dbqueue.E303",
    "timezone": "django_dbqueue.E303",
    "queue": "django_dbqueue.E304",
    "task": "django_dbqueue.E305",
}
HINTS = {
    "django_dbqueue.E302": "Valid keys and values are listed in docs/scheduling.md.",
    "django_dbqueue.E303": "For example 'cron': '0 3 * * *' with 'timezone': 'Europe/Berlin', "
    "'cron': '@hourly', or 'every': 300 (seconds).",
}


def check_schedules(
    app_configs: Any = None,
    *,
    is_registered: Callable[[str], bool] | None = None,
    **kwargs: Any,
) -> list[checks.CheckMessage]:
    """Errors for each schedule that is malformed (E302), has a bad cron expression,
    interval or time zone (E303), names a queue missing from DBQUEUE['QUEUES'] (E304)
    or a task that ``is_registered`` does not know (E305); E301 if the setting is not a
    dict. Without ``is_registered`` a task only has to look like a dotted path."""
    raw = settings.SCHEDULE
    if not isinstance(raw, dict):
        return [
            checks.Error(
                f"DBQUEUE['SCHEDULE'] must be a dict of name -> entry, not {type(raw).__name__}.",
                hint="For example {'nightly': {'task': 'app.jobs.nightly', 'cron': '0 3 * * *'}}.",
                id="django_dbqueue.E301",
            )
        ]
    registered = is_registered or is_dotted_path
    queues = settings.QUEUES
    zone = default_timezone()
    errors: list[checks.CheckMessage] = []
    for name, entry in raw.items():
        try:
            schedule = parse_schedule(name, entry, default_timezone=zone)
        except ScheduleError as exc:
            check_id = FIELD_IDS.get(exc.field or "", "django_dbqueue.E302")
            errors.append(checks.Error(str(exc), hint=HINTS.get(check_id), id=check_id))
            continue
        if schedule.queue is not None and schedule.queue not in queues:
            errors.append(
                checks.Error(
                    f"DBQUEUE['SCHEDULE'][{name!r}]: unknown queue {schedule.queue!r}.",
                    hint=f"Add it to DBQUEUE['QUEUES'] (now {', '.join(map(str, queues))}).",
                    id="django_dbqueue.E304",
                )
            )
        if not registered(schedule.task):
            errors.append(
                checks.Error(
                    f"DBQUEUE['SCHEDULE'][{name!r}]: task {schedule.task!r} is not a "
                    "registered job.",
                    hint="Decorate it with @job, or list its module in DBQUEUE['TASK_MODULES'].",
                    id="django_dbqueue.E305",
                )
            )
    return errors
