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
from tests.support import jobs

pytestmark = pytest.mark.django_db(transaction=True)


@contextmanager
def cursors_made(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """The driver cursors the connection makes meanwhile."""
    made: list[Any] = []
    wrapper = connections[DEFAULT_DB_ALIAS]  # the connection itself, not its proxy
    create = wrapper.create_cursor

    def counted(*args: Any, **kwargs: Any) -> Any:
        cursor = create(*args, **kwargs)
        made.append(cursor)
        return cursor

    monkeypatch.setattr(wrapper, "create_cursor", counted)
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
        assert made, "a cursor of the new connection"  # (MySQL's set-up makes one more)
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
