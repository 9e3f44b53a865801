"""The enqueue path's statements: one INSERT per enqueue(), constant columns bound once
in enqueue_many(), the values stored exactly as given on every database."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction

from django_dbqueue import enqueue, enqueue_many
from django_dbqueue.models import Job
from django_dbqueue.queue import clock
from tests.support import jobs

pytestmark = pytest.mark.django_db


@contextmanager
def statements() -> Iterator[list[str]]:
    """The SQL statements run on the connection (BEGIN of SQLite's atomic() aside)."""
    seen: list[str] = []

    def record(execute: Callable[..., Any], sql: str, *args: Any) -> Any:
        if sql.strip().upper() != "BEGIN":
            seen.append(sql)
        return execute(sql, *args)

    with connection.execute_wrapper(record):
        yield seen


@pytest.mark.parametrize("unique", [False, True], ids=["plain", "unique_key"])
@pytest.mark.parametrize("atomic", [False, True], ids=["autocommit", "atomic"])
def test_enqueue_is_one_statement(transactional_db: None, atomic: bool, unique: bool) -> None:
    options = {"unique_key": "one-statement"} if unique else {}
    connection.ensure_connection()  # connecting runs statements of its own (MySQL)
    clock.queue_now()  # a read of the database's clock, made at most every 10 s
    with statements() as seen:
        if atomic:
            with transaction.atomic():
                job = enqueue(jobs.noop, **options)
        else:
            job = enqueue(jobs.noop, **options)
    # No savepoint, no separate NOTIFY (PostgreSQL's is in the INSERT), no SELECT.
    assert len(seen) == 1, seen
    assert seen[0].startswith("INSERT INTO")
    assert Job.objects.get(pk=job.pk).task == "tests.support.jobs.noop"


def test_a_taken_unique_key_costs_one_insert_and_one_read() -> None:
    first = enqueue(jobs.noop, unique_key="taken")
    connection.ensure_connection()
    clock.queue_now()
    with statements() as seen:
        again = enqueue(jobs.noop, unique_key="taken")
    assert again.pk == first.pk
    assert [sql.split()[0] for sql in seen] == ["INSERT", "SELECT"], seen


def test_enqueue_returns_a_saved_job_with_the_stored_values() -> None:
    job = enqueue(jobs.noop, ["é😀", {"n": 1.5}], {"b": [None, True]}, priority=7, timeout=2.5)
    assert job.pk is not None
    assert not job._state.adding
    assert job._state.db == "default"
    stored = Job.objects.get(pk=job.pk)
    for name in ("args", "kwargs", "priority", "timeout", "queue", "status", "errors"):
        assert getattr(stored, name) == getattr(job, name), name
    assert stored.args == ["é😀", {"n": 1.5}]
    assert stored.created_at == job.created_at
    job.priority = 3
    job.save(update_fields=["priority"])  # an ordinary model instance
    assert Job.objects.get(pk=job.pk).priority == 3


def test_enqueue_many_stores_every_row_in_order_with_its_own_values() -> None:
    items = [
        {
            "task": jobs.noop,
            "args": [i, "x" * (i % 3)],
            "kwargs": {} if i % 3 else {"k": f"é😀\"'\\\n{i}"},
            "priority": i % 5,
            "run_after": timedelta(seconds=i % 2),
            "timeout": 1.5 if i % 4 else None,
            "queue": "emails" if i % 7 == 0 else "default",
            "concurrency_key": f"key-{i % 2}-ü" if i % 5 == 0 else None,
        }
        for i in range(700)
    ]
    created = enqueue_many(items, batch_size=300)
    assert [job.pk for job in created] == sorted(job.pk for job in created)
    stored = {job.pk: job for job in Job.objects.all()}
    assert len(stored) == 700
    for item, job in zip(items, created, strict=True):
        row = stored[job.pk]
        assert row.args == item["args"] == job.args
        assert row.kwargs == item["kwargs"] == job.kwargs
        assert (row.priority, row.timeout, row.queue) == (
            item["priority"],
            item["timeout"],
            item["queue"],
        )
        assert row.concurrency_key == item["concurrency_key"]
        assert abs((row.run_after - job.run_after).total_seconds()) < 0.001
        assert (row.status, row.errors, row.attempts, row.owner) == ("queued", [], 0, "")


def test_enqueue_many_of_identical_jobs_makes_each_row() -> None:
    created = enqueue_many([{"task": jobs.noop}] * 1200, batch_size=500)
    assert len({job.pk for job in created}) == 1200
    assert Job.objects.count() == 1200


@pytest.mark.only_vendor("mysql")
def test_enqueue_many_splits_a_statement_bigger_than_the_packet_limit() -> None:
    connection.ensure_connection()
    connection._dbqueue_max_packet = 8000  # type: ignore[attr-defined]
    try:
        created = enqueue_many({"task": jobs.add, "args": [i, "y" * 50]} for i in range(400))
    finally:
        del connection._dbqueue_max_packet  # type: ignore[attr-defined]
    stored = dict(Job.objects.values_list("pk", "args"))
    assert [stored[job.pk] for job in created] == [[i, "y" * 50] for i in range(400)]


@pytest.mark.only_vendor("postgresql")
def test_a_unique_enqueue_that_returns_the_holder_notifies_nobody(
    transactional_db: None,
) -> None:
    from django_dbqueue.worker import wakeup

    first = enqueue(jobs.noop, unique_key="quiet")
    listener = wakeup.listen(["default"])
    assert listener is not None
    try:
        assert enqueue(jobs.noop, unique_key="quiet").pk == first.pk
        assert not listener.wait(0.3)
    finally:
        listener.close()


def test_a_one_row_insert_names_only_the_nullable_columns_the_job_sets() -> None:
    connection.ensure_connection()
    with statements() as seen:
        bare = enqueue(jobs.noop)
        full = enqueue(
            jobs.noop,
            timeout=2.5,
            retry_backoff=3,
            unique_key="named",
            concurrency_key="customer:1",
            concurrency_limit=2,
        )
    inserts = [sql for sql in seen if sql.startswith("INSERT INTO") and "dbqueue_job" in sql]
    assert len(inserts) == 2, seen
    for column in ("timeout", "unique_key", "concurrency_key", "result", "started_at"):
        assert column not in inserts[0], inserts[0]
    for column in ("timeout", "retry_backoff", "unique_key", "concurrency_limit"):
        assert column in inserts[1], inserts[1]
    stored = Job.objects.get(pk=bare.pk)
    assert (stored.timeout, stored.unique_key, stored.concurrency_key) == (None, None, None)
    assert (stored.result, stored.started_at, stored.finished_at) == (None, None, None)
    stored = Job.objects.get(pk=full.pk)
    assert (stored.timeout, stored.retry_backoff) == (2.5, 3)
    assert (stored.unique_key, stored.origin_unique_key) == ("named", "named")
    assert (stored.concurrency_key, stored.concurrency_limit) == ("customer:1", 2)
