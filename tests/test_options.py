"""The job options, one table (options.py): every door takes each option it lists, and
every hostile value is refused as InvalidJob before any SQL, leaving the caller's
transaction usable."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta, timezone
from io import StringIO
from typing import Any, get_type_hints

import pytest
from django.conf import settings
from django.contrib.admin.utils import flatten_fieldsets
from django.core.management import call_command
from django.db import connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone as django_timezone

from django_dbqueue import enqueue, enqueue_many, options, registry
from django_dbqueue.admin.jobs import JobAdmin
from django_dbqueue.exceptions import InvalidJob
from django_dbqueue.models import Job
from django_dbqueue.queue import clock
from django_dbqueue.registry import job
from django_dbqueue.tasks.backend import DBQueueTask
from django_dbqueue.tasks.compat import InvalidTask, Task
from tests.support import jobs, task_functions

pytestmark = pytest.mark.django_db

# A value of each option that differs from its default and passes its bound.
GOOD: dict[str, Any] = {
    "queue": "emails",
    "priority": 7,
    "run_after": timedelta(minutes=5),
    "max_attempts": 4,
    "timeout": 12.5,
    "retry_backoff": 3.0,
    "unique_key": "options:unique",
    "concurrency_key": "options:key",
    "concurrency_limit": 2,
    "depends_on": [],  # no dependencies: tests/workflows/ covers them
    "on_dependency_failure": "run",
}
# What a Task field of each option takes (the framework wants an aware run_after).
TASK_GOOD = {**GOOD, "run_after": datetime(2100, 1, 1, tzinfo=UTC)}


def with_every_default() -> None:
    """Registered by a test with every default @job takes, then without them."""


def stored(job_id: int, name: str) -> Any:
    return getattr(Job.objects.get(pk=job_id), name)


def test_the_table_names_every_option_once_and_types_it() -> None:
    assert options.NAMES == tuple(GOOD), "a new option needs a good value in GOOD"
    assert set(get_type_hints(options.EnqueueOptions)) == set(options.NAMES)
    assert tuple(get_type_hints(options.JobDefaults)) == options.JOB_DEFAULTS
    for option in options.OPTIONS:
        assert option.doc.endswith("."), option.name
        if option.column:
            Job._meta.get_field(option.name)  # FieldDoesNotExist if the column is missing
        if option.scope == "shared":
            assert option.check is not None, f"{option.name}: shared options are checked once"


def test_enqueue_takes_every_option_and_keeps_it() -> None:
    before = django_timezone.now()
    job = enqueue(jobs.noop, **GOOD)
    for name in options.COLUMNS:
        if name != "run_after":
            assert stored(job.pk, name) == GOOD[name], name
    assert stored(job.pk, "run_after") >= before + GOOD["run_after"]


def test_enqueue_many_takes_every_option_it_lists_and_refuses_the_others_by_name() -> None:
    taken = {name: GOOD[name] for name in options.NAMES if name in options.MANY_NAMES}
    [one] = enqueue_many([{"task": jobs.noop, **taken}])
    for name in taken:
        if name != "run_after":
            assert stored(one.pk, name) == GOOD[name], name
    # Dependencies are not columns of the multi-row INSERT: a call with them goes through
    # workflows/graph.py, one INSERT a job (docs/workflows.md).
    edges = {"depends_on", "on_dependency_failure"}
    for name in set(options.NAMES) - options.MANY_NAMES - edges:
        with pytest.raises(InvalidJob, match=f"enqueue_many\\(\\) does not take {name}"):
            enqueue_many([{"task": jobs.noop, name: GOOD[name]}])
    assert Job.objects.count() == 1
    edged = {"task": jobs.noop, "depends_on": [one], "on_dependency_failure": "run"}
    [waiting] = enqueue_many([edged])
    assert waiting.status == Job.Status.WAITING


def test_job_takes_every_default_the_table_gives_it_and_enqueue_applies_them() -> None:
    defaults = {name: GOOD[name] for name in options.JOB_DEFAULTS}
    entry = registry.register(with_every_default, **defaults)
    assert entry.defaults == defaults
    try:
        made = enqueue(with_every_default)
        for name in options.JOB_DEFAULTS:
            assert stored(made.pk, name) == GOOD[name], name
    finally:
        registry.register(with_every_default)
    for name in set(options.NAMES) - set(options.JOB_DEFAULTS):
        with pytest.raises(TypeError, match=f"@job got an unexpected option '{name}'"):
            job(**{name: GOOD[name]})
    with pytest.raises(TypeError, match="did you mean 'max_attempts'"):
        job(max_attempt=2)


def test_the_task_backend_takes_every_option_through_using() -> None:
    ours = {field.name for field in dataclasses.fields(DBQueueTask)} - {
        field.name for field in dataclasses.fields(Task)
    }
    assert ours == set(options.TASK_FIELDS.values()) - {
        field.name for field in dataclasses.fields(Task)
    }, "DBQueueTask's fields are the table's task fields the framework lacks"
    given = {options.TASK_FIELDS[name]: TASK_GOOD[name] for name in options.TASK_FIELDS}
    declared = task_functions.with_options(task_functions.add, **given)
    for field, value in given.items():
        assert getattr(declared, field) == value, field
    result = declared.enqueue(1, 2)
    made = Job.objects.get(pk=int(result.id))
    for name in options.COLUMNS:
        assert getattr(made, name) == TASK_GOOD[name], name


def test_the_admin_shows_every_option_a_job_keeps() -> None:
    shown = {name.removesuffix("_time") for name in flatten_fieldsets(JobAdmin.fieldsets)}
    assert set(options.COLUMNS) <= shown
    assert set(options.COLUMNS) <= {name.removesuffix("_time") for name in JobAdmin.readonly_fields}


def test_dbqueue_tasks_lists_each_default_that_falls_back_on_a_setting() -> None:
    out = StringIO()
    with override_settings(DBQUEUE={**settings.DBQUEUE, "RETRY_BACKOFF": 9.0}):
        call_command("dbqueue_tasks", "--json", stdout=out)
    rows = {row["path"]: row for row in json.loads(out.getvalue())}
    listed = [o.name for o in options.OPTIONS if o.job_default and o.setting]
    assert listed == ["queue", "priority", "max_attempts", "timeout", "retry_backoff"]
    plain = rows["tests.support.jobs.noop"]
    assert [plain[name] for name in listed] == ["default", 0, 3, None, 9.0]
    framework = rows["tests.support.task_functions.record"]
    assert (framework["queue"], framework["priority"], framework["kind"]) == ("emails", 10, "@task")


# -- hostile values: InvalidJob before any SQL, on every database ------------------------

HOSTILE = [
    ({"unique_key": "k\x00"}, "unique_key contains a NUL character"),
    ({"concurrency_key": "c\x00"}, "concurrency_key contains a NUL character"),
    ({"queue": "emails\x00"}, "queue contains a NUL character"),
    ({"unique_key": "k\ud800"}, "unique_key contains a lone surrogate"),
    ({"concurrency_key": "c\udfff"}, "concurrency_key contains a lone surrogate"),
    ({"queue": "q\ud800"}, "queue contains a lone surrogate"),
]


@pytest.mark.parametrize(("given", "message"), HOSTILE)
def test_a_text_option_no_database_can_store_is_refused_before_any_sql(
    given: dict[str, Any], message: str
) -> None:
    clock.forget()  # the next enqueue must read the database's clock: after the checks
    with CaptureQueriesContext(connection) as queries, pytest.raises(InvalidJob, match=message):
        enqueue(jobs.noop, **given)
    assert queries.captured_queries == []
    many = {k: v for k, v in given.items() if k in options.MANY_NAMES}
    if many:
        with CaptureQueriesContext(connection) as queries:
            with pytest.raises(InvalidJob, match=f"job 1: {message}"):
                enqueue_many([{"task": jobs.noop}, {"task": jobs.noop, **many}])
        # At most the savepoint enqueue_many's batches are validated in.
        assert [q["sql"] for q in queries.captured_queries if "dbqueue" in q["sql"]] == []


@pytest.mark.parametrize(("given", "message"), HOSTILE)
def test_a_hostile_option_inside_atomic_leaves_the_callers_transaction_usable(
    given: dict[str, Any], message: str
) -> None:
    with transaction.atomic():
        kept = enqueue(jobs.noop, unique_key="before")
        with pytest.raises(InvalidJob, match=message):
            enqueue(jobs.noop, **given)
        after = enqueue(jobs.noop)  # the transaction goes on
    assert set(Job.objects.values_list("pk", flat=True)) == {kept.pk, after.pk}


def test_a_concurrency_key_formatted_with_a_nul_from_the_arguments_is_refused() -> None:
    with transaction.atomic():
        with pytest.raises(InvalidJob, match="concurrency_key contains a NUL"):
            enqueue(jobs.keyed_probe, ["a\x00b", 1])
        enqueue(jobs.keyed_probe, ["ab", 1])
    assert list(Job.objects.values_list("concurrency_key", flat=True)) == ["probe:ab"]


def test_a_task_path_with_a_nul_is_refused_even_without_task_validation() -> None:
    with override_settings(DBQUEUE={"VALIDATE_TASKS": False}), transaction.atomic():
        with pytest.raises(InvalidJob, match="not a dotted path"):
            enqueue("tests.support.jobs.no\x00op")
        with pytest.raises(InvalidJob, match="not a dotted path"):
            enqueue_many([{"task": "tests.support.jobs.no\x00op"}])
        enqueue("tests.support.jobs.noop")
    assert Job.objects.count() == 1


@pytest.mark.parametrize("minutes", [23 * 60 + 59, -(23 * 60 + 59), 16 * 60, 5 * 60 + 30])
def test_run_after_with_any_offset_python_allows_is_stored_as_the_same_instant(
    minutes: int,
) -> None:
    """PostgreSQL refuses offsets beyond 15:59 (DataError, aborting the transaction):
    a moment is normalised to UTC before it is written, the instant unchanged."""
    zone = timezone(timedelta(minutes=minutes))
    at = (django_timezone.now() + timedelta(hours=2)).astimezone(zone).replace(microsecond=0)
    with transaction.atomic():
        made = enqueue(jobs.noop, run_after=at)
        [many] = enqueue_many([{"task": jobs.noop, "run_after": at}])
        assert Job.objects.count() == 2  # the transaction is usable
    assert made.run_after == at and made.run_after.utcoffset() == timedelta(0)
    assert stored(made.pk, "run_after") == at
    assert stored(many.pk, "run_after") == at


def test_run_after_with_a_large_offset_through_the_task_backend_is_stored() -> None:
    zone = timezone(timedelta(hours=23, minutes=59))
    at = datetime(2100, 1, 1, 12, tzinfo=zone)
    result = task_functions.with_options(task_functions.add, run_after=at).enqueue(1, 2)
    assert stored(int(result.id), "run_after") == at
    assert result.task.run_after == at


def test_a_hostile_task_option_is_the_frameworks_invalid_task() -> None:
    with pytest.raises(InvalidTask, match="unique_key contains a NUL"):
        task_functions.with_options(task_functions.add, unique_key="k\x00")
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [(["a\ud800b"], {}), ([], {"text": "\udfff"}), ([], {"key\ud800": 1}), ([["\ud83d"]], {})],
)
def test_arguments_with_a_lone_surrogate_are_refused_inside_atomic(
    args: list[Any], kwargs: dict[str, Any]
) -> None:
    with transaction.atomic():
        with pytest.raises(InvalidJob, match="lone surrogate"):
            enqueue(jobs.record, args, kwargs)
        with pytest.raises(InvalidJob, match=r"job 0: Job .* lone surrogate"):
            enqueue_many([{"task": jobs.record, "args": args, "kwargs": kwargs}])
        kept = enqueue(jobs.record, ["emoji \U0001f600 and a backslash-u: \\ud800"])
    assert stored(kept.pk, "args") == ["emoji \U0001f600 and a backslash-u: \\ud800"]


def test_what_enqueue_keeps_of_its_checks_follows_the_task_and_the_settings() -> None:
    registry.register(with_every_default, queue="emails")
    try:
        assert enqueue(with_every_default).queue == "emails"
        registry.register(with_every_default, queue="reports")  # registered again
        assert enqueue(with_every_default).queue == "reports"
        with override_settings(DBQUEUE={**settings.DBQUEUE, "QUEUES": ["default", "emails"]}):
            for _ in range(2):  # a refusal is not kept as an answer
                with pytest.raises(InvalidJob, match="Unknown queue 'reports'"):
                    enqueue(with_every_default)
            assert enqueue(with_every_default, queue="emails").queue == "emails"
        assert enqueue(with_every_default).queue == "reports"
        assert enqueue(with_every_default, priority=1).priority == 1
        with pytest.raises(InvalidJob, match="priority must be an integer, not True"):
            enqueue(with_every_default, priority=True)  # equal to 1, but not an integer
    finally:
        registry.register(with_every_default)
