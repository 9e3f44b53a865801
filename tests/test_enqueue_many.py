"""enqueue_many(): each item validated in full though jobs sharing a task and options are
checked once, nothing written when one item is bad, and Job objects equal to their rows."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from django_dbqueue import enqueue_many
from django_dbqueue.bulk import JobSpec
from django_dbqueue.exceptions import InvalidJob
from django_dbqueue.models import Job
from tests.support import jobs

pytestmark = pytest.mark.django_db


class Equal(int):
    """An integer that claims to equal every integer: a cache keyed on equality would
    take a later, invalid one for an earlier, valid one."""

    def __eq__(self, other: object) -> bool:
        return True

    def __hash__(self) -> int:
        return 0


def _circular() -> list[Any]:
    items: list[Any] = [1]
    items.append(items)
    return items


def _nested(levels: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(levels):
        value = [value]
    return value


# Each follows 300 good jobs of the same task (and options where it has any): the bad
# one must be found although the jobs before it validated the shared part already.
BAD_LAST: list[tuple[dict[str, Any], dict[str, Any], str]] = [
    ({}, {"task": "tests.support.jobs.nope"}, "not a registered task"),
    ({}, {"task": lambda: None}, "lambda"),
    ({}, {"queue": "nowhere"}, "Unknown queue"),
    ({"priority": 1}, {"priority": True}, "priority must be an integer"),
    ({"priority": 1}, {"priority": 1.0}, "priority must be an integer"),
    ({"priority": 5}, {"priority": 40000}, "priority must be between"),
    ({"priority": Equal(5)}, {"priority": Equal(40000)}, "priority must be between"),
    ({"max_attempts": 3}, {"max_attempts": 0}, "max_attempts"),
    ({"timeout": 1.0}, {"timeout": float("nan")}, "finite"),
    ({"retry_backoff": 1}, {"retry_backoff": -1}, "retry_backoff"),
    ({}, {"concurrency_limit": 2}, "needs a concurrency_key"),
    ({"concurrency_key": "k"}, {"concurrency_key": ""}, "concurrency_key must be"),
    ({"concurrency_key": "k"}, {"concurrency_key": 7}, "concurrency_key must be"),
    ({"concurrency_key": "k"}, {"concurrency_key": "k", "concurrency_limit": 0}, "limit"),
    ({}, {"run_after": datetime(2030, 1, 1)}, "timezone-aware"),
    ({}, {"run_after": timedelta(days=40000)}, "100 years"),
    ({}, {"run_after": "soon"}, "run_after must be"),
    ({}, {"args": [object()]}, "JSON-serializable"),
    ({}, {"args": [float("inf")]}, "JSON-serializable"),
    ({}, {"args": _circular()}, "nested deeper"),
    ({}, {"args": [[[]] * 2, _nested(40)]}, "nested deeper"),
    ({}, {"args": ["a\x00b"]}, "NUL character"),
    ({}, {"args": "ab"}, "args must be a list or tuple"),
    ({}, {"args": 0}, "args must be a list or tuple"),
    ({}, {"kwargs": {1: "x"}}, "string keys"),
    ({}, {"kwargs": [("a", 1)]}, "string keys"),
    ({}, {"args": ["x" * 2_000_000]}, "MAX_PAYLOAD_BYTES"),
    ({}, {"unique_key": "u"}, "does not take unique_key"),
]


@pytest.mark.parametrize(("shared", "bad", "message"), BAD_LAST, ids=[m for _, _, m in BAD_LAST])
def test_one_bad_job_after_many_good_ones_writes_nothing(
    shared: dict[str, Any], bad: dict[str, Any], message: str
) -> None:
    good = [{"task": jobs.add, "args": [i, 1], **shared} for i in range(300)]
    last = {"task": jobs.add, "args": [0, 1], **shared, **bad}
    with pytest.raises(InvalidJob, match=message) as raised:
        enqueue_many([*good, last])
    assert str(raised.value).startswith("job 300: ")
    assert not Job.objects.exists()


def test_a_bad_job_first_or_in_the_middle_writes_nothing() -> None:
    for position in (0, 150):
        items: list[Any] = [JobSpec(jobs.add, [i, 1]) for i in range(300)]
        items[position] = JobSpec(jobs.add, [1], {"b": object()})
        with pytest.raises(InvalidJob, match=f"job {position}: "):
            enqueue_many(items)
    assert not Job.objects.exists()


def test_a_misspelt_option_after_good_jobs_is_a_type_error_and_writes_nothing() -> None:
    items = [{"task": jobs.noop, "queue": "emails"}] * 10 + [{"task": jobs.noop, "queu": "x"}]
    with pytest.raises(TypeError, match="job 10: enqueue_many\\(\\) got an unexpected option"):
        enqueue_many(items)
    assert not Job.objects.exists()


def test_an_item_without_a_task_writes_nothing() -> None:
    with pytest.raises(InvalidJob, match="job 1: every job needs a 'task'"):
        enqueue_many([{"task": jobs.noop}, {"args": [1]}])
    assert not Job.objects.exists()


def test_a_generator_that_fails_midway_writes_nothing() -> None:
    def items() -> Iterator[dict[str, Any]]:
        for i in range(500):
            if i == 400:
                raise RuntimeError("the caller's generator failed")
            yield {"task": jobs.add, "args": [i, i]}

    with pytest.raises(RuntimeError):
        enqueue_many(items())
    assert not Job.objects.exists()


def test_jobs_rolled_back_with_the_callers_transaction() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        enqueue_many({"task": jobs.noop} for _ in range(100))
        raise RuntimeError("the view failed")
    assert not Job.objects.exists()


def _fields(job: Job) -> dict[str, Any]:
    return {f.attname: getattr(job, f.attname) for f in Job._meta.concrete_fields}


def test_returned_jobs_equal_their_rows_field_for_field() -> None:
    later = timezone.now() + timedelta(hours=1)
    items: list[JobSpec | dict[str, Any]] = []
    for i in range(400):
        kind = i % 4
        if kind == 0:
            items.append({"task": jobs.noop})
        elif kind == 1:
            items.append(JobSpec(jobs.add, (i, [1, {"t": (2, 3)}]), {}, {"priority": -3}))
        elif kind == 2:
            items.append({"task": jobs.keyed_probe, "args": [f"c{i % 3}", i], "queue": "emails"})
        else:
            items.append({"task": "tests.support.jobs.record", "kwargs": {"key": f"r{i}"},
                          "run_after": later, "timeout": 2, "concurrency_key": f"k{i}",
                          "concurrency_limit": 3})  # fmt: skip
    created = enqueue_many(items, batch_size=150)
    assert len(created) == 400
    stored = {job.pk: job for job in Job.objects.all()}
    for job in created:
        assert job.pk is not None
        assert (job._state.adding, job._state.db) == (False, "default")
        row = stored[job.pk]
        expected = _fields(row)
        if job.run_after.tzinfo is not None:  # each database's own precision and zone
            assert abs(job.run_after - row.run_after) < timedelta(milliseconds=1)
            assert abs(job.created_at - row.created_at) < timedelta(milliseconds=1)
            expected["run_after"], expected["created_at"] = job.run_after, job.created_at
        assert _fields(job) == expected
    assert created[1].args == [1, [1, {"t": [2, 3]}]]  # as the job will receive them
    assert {created[2].concurrency_key, created[6].concurrency_key} == {"probe:c2", "probe:c0"}
    assert (created[3].concurrency_key, created[3].concurrency_limit) == ("k3", 3)
    assert created[3].run_after == later


def test_returned_jobs_do_not_share_mutable_values() -> None:
    args = [1, 2]
    created = enqueue_many([{"task": jobs.add, "args": args}, {"task": jobs.add, "args": args}])
    created[0].args.append(3)
    created[0].errors.append("x")
    assert created[1].args == [1, 2] == args
    assert created[1].errors == []
    created[0].priority = 9
    created[0].save(update_fields=["priority"])  # ordinary model instances
    assert Job.objects.get(pk=created[0].pk).priority == 9


def test_the_caller_changing_an_argument_later_changes_no_job() -> None:
    args = [{"n": 1}]
    created = enqueue_many([{"task": jobs.noop, "args": args}] * 2)
    args[0]["n"] = 2
    assert [job.args for job in created] == [[{"n": 1}]] * 2


def test_garbage_collection_is_on_again_after_a_call_and_after_a_failure() -> None:
    enqueue_many([{"task": jobs.noop}])
    assert gc.isenabled()
    with pytest.raises(InvalidJob):
        enqueue_many([{"task": jobs.noop, "priority": "high"}])
    assert gc.isenabled()
    gc.disable()
    try:
        enqueue_many([{"task": jobs.noop}])
        assert not gc.isenabled()  # left as the caller had it
    finally:
        gc.enable()


def test_options_equal_in_value_but_not_in_type_are_each_stored_as_given() -> None:
    when = datetime(2031, 5, 1, 12, tzinfo=UTC)
    created = enqueue_many(
        [
            {"task": jobs.noop, "timeout": 2},
            {"task": jobs.noop, "timeout": 2.0},
            {"task": jobs.noop, "run_after": when},
            {"task": jobs.noop, "run_after": when.astimezone(timezone.get_fixed_timezone(60))},
        ]
    )
    rows = {job.pk: job for job in Job.objects.all()}
    assert [rows[job.pk].timeout for job in created[:2]] == [2.0, 2.0]
    assert [rows[job.pk].run_after for job in created[2:]] == [when, when]


def test_a_failure_while_the_next_statement_runs_writes_nothing_and_leaves_the_connection_usable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django_dbqueue import bulk

    built = bulk._Validated.jobs

    def fail_once(self: Any, *args: Any) -> list[Job]:
        monkeypatch.setattr(bulk._Validated, "jobs", built)
        raise RuntimeError("building the first statement's jobs failed")

    monkeypatch.setattr(bulk._Validated, "jobs", fail_once)
    with pytest.raises(RuntimeError):
        enqueue_many(({"task": jobs.add, "args": [i, i]} for i in range(300)), batch_size=100)
    assert not Job.objects.exists()  # the connection answers: no statement was left unread
    assert len(enqueue_many([{"task": jobs.noop}] * 250, batch_size=100)) == 250


@pytest.mark.only_vendor("mysql")
def test_a_database_error_in_a_later_statement_writes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django.db import DatabaseError

    from django_dbqueue.queue.dialects import json_table

    made = json_table.json_table_statements
    count = 0

    def second_one_broken(*args: Any) -> Any:
        nonlocal count
        count += 1
        statements = made(*args)
        if count == 2:
            return [(rows, sql.replace("INSERT INTO", "INSERT INTO nowhere"), params)
                    for rows, sql, params in statements]  # fmt: skip
        return statements

    monkeypatch.setattr(json_table, "json_table_statements", second_one_broken)
    with pytest.raises(DatabaseError):
        enqueue_many(({"task": jobs.add, "args": [i, i]} for i in range(300)), batch_size=100)
    assert count == 2
    assert not Job.objects.exists()


def test_a_bad_job_in_a_later_batch_rolls_back_the_batches_before_it_only() -> None:
    kept = enqueue_many([{"task": jobs.noop}])
    items: list[Any] = [{"task": jobs.add, "args": [i, 1]} for i in range(500)]
    items.append({"task": jobs.add, "args": [object()]})
    with transaction.atomic():
        mine = enqueue_many([{"task": jobs.noop, "queue": "emails"}])
        with pytest.raises(InvalidJob, match="job 500: "):
            enqueue_many(items, batch_size=100)  # five statements ran before job 500
        assert Job.objects.filter(task="tests.support.jobs.add").count() == 0
    assert sorted(Job.objects.values_list("pk", flat=True)) == [kept[0].pk, mine[0].pk]


def test_a_generator_that_queries_the_database_for_each_job() -> None:
    enqueue_many([{"task": jobs.noop}] * 30)
    created = enqueue_many(
        ({"task": jobs.add, "args": [job.pk, Job.objects.filter(pk=job.pk).count()]}
         for job in Job.objects.order_by("pk").iterator(chunk_size=7)),
        batch_size=10,
    )  # fmt: skip
    assert [job.args[1] for job in created] == [1] * 30
