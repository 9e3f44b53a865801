"""enqueue() keeps its cursor from one call to the next (queue/insert.py,
``OneRowInsert.cursor``) and still goes through everything Django's own cursor does:
execute wrappers, query logging, the broken-transaction check, reconnects, health
checks and the caller's transaction."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.db.transaction import TransactionManagementError
from django.test.utils import CaptureQueriesContext

from django_dbqueue import enqueue
from django_dbqueue.models import Job
from django_dbqueue.queue.dialects import dialect
from tests.support import jobs

pytestmark = pytest.mark.django_db(transaction=True)


@contextmanager
def cursors_made(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """The cursors enqueue makes meanwhile (``Dialect.one_row_cursor``: Django's own, or
    on PostgreSQL one that binds on the server)."""
    made: list[Any] = []
    kind = type(dialect(connections[DEFAULT_DB_ALIAS]))
    make = kind.one_row_cursor

    def counted(self: Any, conn: Any) -> Any:
        cursor = make(self, conn)
        made.append(cursor)
        return cursor

    monkeypatch.setattr(kind, "one_row_cursor", counted)
    yield made


def test_enqueues_share_one_cursor(monkeypatch: pytest.MonkeyPatch) -> None:
    enqueue(jobs.noop)
    with cursors_made(monkeypatch) as made:
        ids = [enqueue(jobs.noop).pk for _ in range(3)]
    assert made == []
    assert Job.objects.filter(pk__in=ids).count() == 3


def test_execute_wrappers_and_query_logging_see_every_insert() -> None:
    enqueue(jobs.noop)
    seen: list[str] = []

    def record(execute: Any, sql: str, *args: Any) -> Any:
        seen.append(sql)
        return execute(sql, *args)

    with connection.execute_wrapper(record):
        enqueue(jobs.noop)
    assert [sql for sql in seen if sql.startswith("INSERT")], seen
    with CaptureQueriesContext(connection) as logged:
        enqueue(jobs.noop)
    assert [q for q in logged.captured_queries if q["sql"].startswith("INSERT")]
    enqueue(jobs.noop)  # logging off again: back to a kept cursor
    assert Job.objects.count() == 4


def test_an_enqueue_after_the_connection_closed_reconnects(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    enqueue(jobs.noop)
    connection.close()
    with cursors_made(monkeypatch) as made:
        job = enqueue(jobs.noop)
        assert len(made) == 1, "a cursor of the new connection"
        made.clear()
        again = enqueue(jobs.noop)
    assert made == [], "kept again"
    assert Job.objects.filter(pk__in=[job.pk, again.pk]).count() == 2


def test_a_due_health_check_goes_through_djangos_cursor(monkeypatch: pytest.MonkeyPatch) -> None:
    enqueue(jobs.noop)
    wrapper = connections[DEFAULT_DB_ALIAS]
    monkeypatch.setattr(wrapper, "health_check_enabled", True)
    monkeypatch.setattr(wrapper, "health_check_done", False)
    checked: list[bool] = []
    monkeypatch.setattr(wrapper, "close_if_health_check_failed", lambda: checked.append(True))
    enqueue(jobs.noop)
    assert checked == [True]


def test_the_callers_transaction_holds_and_a_broken_one_refuses() -> None:
    enqueue(jobs.noop)
    with transaction.atomic():
        kept = enqueue(jobs.noop)
        transaction.set_rollback(True)
    assert not Job.objects.filter(pk=kept.pk).exists(), "rolled back with the caller"
    with transaction.atomic():
        transaction.set_rollback(True)
        with pytest.raises(TransactionManagementError):
            enqueue(jobs.noop)
    assert Job.objects.count() == 1


@pytest.mark.only_vendor("postgresql")  # psycopg's binding
def test_postgresql_binds_on_the_server_and_prepares_where_the_project_allows_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Django leaves prepared statements off (``prepare_threshold`` None, for the poolers
    that cannot keep them): the INSERT is then not prepared. With the threshold that
    ``OPTIONS["prepare_threshold"]`` sets, it is prepared once and used again: once in
    each of its two forms, with and without the wake-up's ``pg_notify`` (left out while
    the queue's last wake-up is recent: queue/announce.py)."""
    from django.db.backends.postgresql.base import is_psycopg3

    def prepared_inserts() -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s",
                [f'INSERT INTO "{Job._meta.db_table}"%'],
            )
            return int(cursor.fetchone()[0])

    # A connection of its own with Django's default (the test project prepares after 5).
    connection.close()
    options = {**connection.settings_dict["OPTIONS"], "prepare_threshold": None}
    monkeypatch.setitem(connection.settings_dict, "OPTIONS", options)
    ids = [enqueue(jobs.noop).pk for _ in range(6)]
    assert prepared_inserts() == 0
    assert is_psycopg3, "the extra installs psycopg 3"
    driver = connection.connection
    assert driver.prepare_threshold is None, "Django's default"
    sent: list[str] = []

    def record(execute: Any, sql: str, *args: Any) -> Any:
        sent.append(sql)
        return execute(sql, *args)

    driver.prepare_threshold = 0  # prepared at its first execution
    try:
        with connection.execute_wrapper(record):
            ids += [enqueue(jobs.noop, args=[n]).pk for n in range(12)]
        inserts = [sql for sql in sent if sql.startswith("INSERT")]  # (and pg_notify's)
        shapes = set(inserts)
        assert len(inserts) == 12 and 1 <= len(shapes) <= 2
        assert prepared_inserts() == len(shapes), "each form prepared once, then used again"
    finally:
        connection.close()  # the next one as the settings make it
    assert Job.objects.filter(pk__in=ids).count() == 18
    assert sorted(Job.objects.filter(pk__in=ids[6:]).values_list("args", flat=True)) == [
        [n] for n in range(12)
    ]
