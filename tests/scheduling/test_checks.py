"""System checks name every bad schedule (the app registers them; here they are called)."""

from __future__ import annotations

from typing import Any

from django_dbqueue.scheduling.checks import check_schedules


def run(settings: Any, schedule: Any, **kwargs: Any) -> list[tuple[str, str]]:
    settings.DBQUEUE = {**settings.DBQUEUE, "SCHEDULE": schedule}
    return [(error.id or "", error.msg) for error in check_schedules(None, **kwargs)]


def test_valid_schedules_pass(settings: Any) -> None:
    schedule = {
        "nightly": {"task": "app.jobs.nightly", "cron": "0 3 * * *", "queue": "reports"},
        "poll": {"task": "app.jobs.poll", "every": 300},
    }
    assert run(settings, schedule) == []


def test_empty_schedule_passes(settings: Any) -> None:
    assert run(settings, {}) == []


def test_setting_that_is_not_a_dict(settings: Any) -> None:
    [(check_id, message)] = run(settings, ["nightly"])
    assert check_id == "django_dbqueue.E301"
    assert "must be a dict" in message


def test_each_bad_entry_is_reported_by_name(settings: Any) -> None:
    schedule = {
        "good": {"task": "app.jobs.ok", "every": 60},
        "typo": {"task": "app.jobs.a", "every": 60, "queu": "reports"},
        "bad-cron": {"task": "app.jobs.b", "cron": "0 25 * * *"},
        "bad-zone": {"task": "app.jobs.c", "cron": "0 3 * * *", "timezone": "Mars/Base"},
    }
    errors = run(settings, schedule)
    assert [check_id for check_id, _ in errors] == [
        "django_dbqueue.E302",
        "django_dbqueue.E303",
        "django_dbqueue.E303",
    ]
    assert "['typo']" in errors[0][1] and "Did you mean 'queue'?" in errors[0][1]
    assert "['bad-cron']" in errors[1][1] and "Bad hour" in errors[1][1]
    assert "['bad-zone']" in errors[2][1]


def test_invalid_every_is_reported(settings: Any) -> None:
    [(check_id, message)] = run(settings, {"fast": {"task": "app.jobs.a", "every": 0}})
    assert check_id == "django_dbqueue.E303"
    assert "['fast']" in message


def test_unknown_queue_is_reported(settings: Any) -> None:
    [(check_id, message)] = run(
        settings, {"nightly": {"task": "app.jobs.a", "cron": "@daily", "queue": "nope"}}
    )
    assert check_id == "django_dbqueue.E304"
    assert "['nightly']" in message and "'nope'" in message


def test_task_that_is_not_a_dotted_path_is_reported(settings: Any) -> None:
    [(check_id, message)] = run(settings, {"nightly": {"task": "nightly", "cron": "@daily"}})
    assert check_id == "django_dbqueue.E305"
    assert "['nightly']" in message


def test_unregistered_task_is_reported(settings: Any) -> None:
    registered = {"app.jobs.known"}
    errors = run(
        settings,
        {
            "known": {"task": "app.jobs.known", "every": 60},
            "unknown": {"task": "app.jobs.unknown", "every": 60},
        },
        is_registered=registered.__contains__,
    )
    assert errors == [
        (
            "django_dbqueue.E305",
            "DBQUEUE['SCHEDULE']['unknown']: task 'app.jobs.unknown' is not a registered job.",
        )
    ]
