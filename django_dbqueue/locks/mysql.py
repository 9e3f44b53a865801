"""MySQL/MariaDB locks: ``GET_LOCK`` on a dedicated session (see locks/database.py).

Lock names are server-wide (not per database) and limited: 64 characters on MySQL, 192
bytes on MariaDB (which rejects 64 emoji with error 1059), cut at a NUL byte by both, and
compared case-insensitively by some versions. So the server never sees the name itself:
every key is 23 readable ASCII characters of the name, ``~``, and 40 hex digits of the
SHA-256 of the name (or of the tagged slot of a semaphore, locks/names.py). A semaphore of
N tries its N slot keys in turn with ``GET_LOCK(key, 0)``.
"""

from __future__ import annotations

from typing import Any

from django.db import connections

from django_dbqueue.exceptions import LockConfigurationError
from django_dbqueue.locks.counter_rows import mysql_fence_next
from django_dbqueue.locks.database import DatabaseLock
from django_dbqueue.locks.names import lock_digest, readable
from django_dbqueue.queue.dialects.galera import wsrep_on

MAX_NAME = 64
READABLE_CHARS = MAX_NAME - 41  # then "~" and 40 hex digits (160 bits)


def get_lock_name(full_name: str, slot: int | None) -> str:
    """The ``GET_LOCK`` name of lock ``full_name`` (``slot``: of that semaphore slot)."""
    return f"{readable(full_name, READABLE_CHARS)}~{lock_digest(full_name, slot).hex()[:40]}"


class MySQLLock(DatabaseLock):
    backend_name = "mysql"
    vendor = "mysql"

    def __init__(self, name: str, **options: Any) -> None:
        super().__init__(name, **options)
        if wsrep_on(connections[self.alias]):
            raise LockConfigurationError(
                f"The mysql lock backend cannot exclude across the nodes of a Galera "
                f"cluster (database {self.alias!r}): GET_LOCK is local to one node, so two "
                "holders on two nodes would both get the lock. Use backend='galera' (the "
                "default there: lease rows that certification keeps exclusive) or 'redis'."
            )

    def query_token(self, counter: str) -> int:
        return mysql_fence_next(self, counter)

    def lock_key(self, slot: int | None) -> str:
        return get_lock_name(self.full_name, slot)

    def try_lock(self, key: str) -> bool:
        # 1: acquired, 0: busy, NULL: error (e.g. killed while waiting).
        return bool(self.query("SELECT GET_LOCK(%s, 0)", [key]) == 1)

    def unlock(self, key: str) -> bool:
        # 1: released; 0: held by another session; NULL: nobody holds it (ours expired
        # with our session). Only 1 means it was still ours.
        return bool(self.query("SELECT RELEASE_LOCK(%s)", [key]) == 1)

    def is_mine(self, key: str) -> bool:
        return bool(self.query("SELECT IS_USED_LOCK(%s) = CONNECTION_ID()", [key]) == 1)

    def connection_id(self) -> int:
        """This holder's session id (what ``KILL`` and ``IS_USED_LOCK`` show)."""
        return int(self.query("SELECT CONNECTION_ID()", []))
