"""System checks for ``DBQUEUE['SCHEDULE']``: every bad entry reported by name.

Not registered here: the app's checks module does that, handing over the task registry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core import checks

from django_dbqueue import registry
from django_dbqueue.conf import settings
from django_dbqueue.exceptions import ScheduleError
from django_dbqueue.scheduling.config import (
    clash_message,
    default_timezone,
    is_dotted_path,
    parse_schedule,
)

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
    or a task that ``is_registered`` does not know (E305), with arguments its function
    does not take (E307); E301 if the setting is not a
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
        errors += _unknown_queue(f"DBQUEUE['SCHEDULE'][{name!r}]", schedule.queue, queues)
        if not registered(schedule.task):
            errors.append(
                checks.Error(
                    f"DBQUEUE['SCHEDULE'][{name!r}]: task {schedule.task!r} is not a "
                    "registered job.",
                    hint="Decorate it with @job, or list its module in DBQUEUE['TASK_MODULES'].",
                    id="django_dbqueue.E305",
                )
            )
        elif is_registered is not None:
            errors += _unfit_arguments(name, schedule.task, schedule.args, schedule.kwargs)
    if is_registered is not None:  # the task modules are imported: their schedules count
        errors += _check_declared(set(raw), queues, zone)
    return errors


def _check_declared(taken: set[str], queues: list[str], zone: str) -> list[checks.CheckMessage]:
    """@job(schedule=...): an unknown queue (E304), a name also used in the setting or by
    another declaration (E306). The rest was checked when the decorator ran."""
    try:
        registry.discover()
    except Exception:  # a task module that fails to import is E402's to report
        return []
    errors: list[checks.CheckMessage] = []
    owners = {name: "DBQUEUE['SCHEDULE']" for name in taken}
    for path, name, entry in registry.declared_schedules():
        where = f"@job(schedule=...) on {path}"
        if name in owners:
            errors.append(
                checks.Error(
                    f"{where}: {clash_message(name, owners[name])}",
                    hint="Give the decorator's schedule a 'name' of its own.",
                    id="django_dbqueue.E306",
                )
            )
            continue
        owners[name] = where
        try:
            schedule = parse_schedule(name, entry, default_timezone=zone)
        except ScheduleError as exc:  # the default time zone is applied only now
            errors.append(checks.Error(f"{where}: {exc.message}", id="django_dbqueue.E303"))
            continue
        errors += _unknown_queue(f"{where} (schedule {name!r})", schedule.queue, queues)
    return errors


def _unfit_arguments(name: str, path: str, args: Any, kwargs: Any) -> list[checks.CheckMessage]:
    problem = registry.arguments_problem(path, args, kwargs)
    if not problem:
        return []
    return [
        checks.Error(
            f"DBQUEUE['SCHEDULE'][{name!r}]: {problem}",
            hint="Give 'args' and 'kwargs' that the task's function takes.",
            id="django_dbqueue.E307",
        )
    ]


def _unknown_queue(where: str, queue: str | None, queues: list[str]) -> list[checks.CheckMessage]:
    if queue is None or queue in queues:
        return []
    hint = f"Add it to DBQUEUE['QUEUES'] (now {', '.join(map(str, queues))})."
    return [checks.Error(f"{where}: unknown queue {queue!r}.", hint=hint, id="django_dbqueue.E304")]
