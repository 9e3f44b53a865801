"""Advisory-lock pitfalls: stable keys, session ownership. PostgreSQL run only."""

from __future__ import annotations

import hashlib
import uuid

import pytest
from django.db import close_old_connections, connection

from django_dbqueue.locks import LockLost, named_lock
from django_dbqueue.locks.postgres import PostgresLock

pytestmark = [pytest.mark.only_vendor("postgres"), pytest.mark.django_db(transaction=True)]


def advisory_holders(name: str) -> list[int]:
    """Backend pids holding the advisory lock whose key is SHA-256(name)[:8], as pg_locks
    shows it to another session: classid = high 32 bits, objid = low 32 bits."""
    key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND classid::text = %s AND objid::text = %s AND objsubid = 1",
            [str(key >> 32), str(key & 0xFFFFFFFF)],
        )
        return [row[0] for row in cursor.fetchall()]


def test_the_key_is_sha256_of_the_name_and_lives_on_its_own_session() -> None:
    name = f"test-{uuid.uuid4().hex}-ключ-" + "x" * 300
    with named_lock(name, backend="postgres") as lock:
        assert isinstance(lock, PostgresLock)
        request_pid = connection.cursor().connection.info.backend_pid
        connection.close()
        close_old_connections()
        assert advisory_holders(lock.full_name) == [lock.backend_pid()]
        assert lock.backend_pid() != request_pid
        assert lock.owned()
    assert advisory_holders(lock.full_name) == []


def test_a_terminated_holder_session_is_detected() -> None:
    name = f"test-{uuid.uuid4().hex}"
    with pytest.raises(LockLost):
        with named_lock(name, backend="postgres") as lock:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(%s)", [lock.backend_pid()])
            assert not lock.owned()
            with named_lock(name, backend="postgres", blocking_timeout=5) as successor:
                assert successor.owned()
