"""GET_LOCK pitfalls: the lock belongs to a session. MySQL/MariaDB run only."""

from __future__ import annotations

import uuid

import pytest
from django.db import close_old_connections, connection

from django_dbqueue.locks import LockLost, named_lock
from django_dbqueue.locks.mysql import MAX_NAME, MySQLLock, get_lock_name

pytestmark = [pytest.mark.only_vendor("mysql"), pytest.mark.django_db(transaction=True)]


def holder_of(name: str) -> int | None:
    """Connection id holding GET_LOCK ``name``, seen from the test's own session."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT IS_USED_LOCK(%s)", [get_lock_name(name, None)])
        row = cursor.fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def test_the_lock_lives_on_its_own_session_not_the_requests() -> None:
    name = f"test-{uuid.uuid4().hex}"
    with named_lock(name, backend="mysql") as lock:
        assert isinstance(lock, MySQLLock)
        with connection.cursor() as cursor:
            cursor.execute("SELECT CONNECTION_ID()")
            request_session = cursor.fetchone()
        # What Django does at the end of every request and around every worker job.
        connection.close()
        close_old_connections()
        holder = holder_of(lock.full_name)
        assert holder == lock.connection_id()
        assert request_session is not None and holder != request_session[0]
        assert lock.owned()
    assert holder_of(lock.full_name) is None


def test_long_names_are_hashed_to_64_characters_and_stay_distinct() -> None:
    base = f"test-{uuid.uuid4().hex}-" + "é" * 300
    with named_lock(base + "a", backend="mysql") as a, named_lock(base + "b", backend="mysql") as b:
        short_a, short_b = get_lock_name(a.full_name, None), get_lock_name(b.full_name, None)
        assert len(short_a) == len(short_b) == MAX_NAME and short_a != short_b
        assert short_a.startswith("dbqueue:lock:test-")
        assert holder_of(a.full_name) == a.connection_id()
        assert holder_of(b.full_name) == b.connection_id()


def test_a_killed_holder_session_is_detected() -> None:
    name = f"test-{uuid.uuid4().hex}"
    lost = []
    with pytest.raises(LockLost, match="was lost before release"):
        with named_lock(name, backend="mysql", on_lost=lost.append) as lock:
            with connection.cursor() as cursor:
                cursor.execute("KILL %s", [lock.connection_id()])
            assert not lock.owned()
            assert lost == [lock]
            # The server dropped the lock with the session: someone else can have it now.
            with named_lock(name, backend="mysql", blocking_timeout=5) as successor:
                assert successor.owned()
