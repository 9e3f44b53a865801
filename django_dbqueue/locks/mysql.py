"""MySQL/MariaDB locks: ``GET_LOCK`` on a dedicated session (see locks/database.py).

Lock names are server-wide (not per database) and limited to 64 characters: longer names
keep a readable prefix and end in 40 hex digits of their SHA-256. A semaphore of N is the
N slots ``name:0`` .. ``name:N-1``, tried in turn with ``GET_LOCK(slot, 0)``.
"""

from __future__ import annotations

from django_dbqueue.locks.base import short_name
from django_dbqueue.locks.database import DatabaseLock

MAX_NAME = 64


class MySQLLock(DatabaseLock):
    backend_name = "mysql"
    vendor = "mysql"
    # LAST_INSERT_ID(expr) hands the new value back to this session only: one atomic
    # statement, no read-then-write, and it works the same on MariaDB and MySQL.
    fencing_sql = (
        "INSERT INTO dbqueue_counter (name, value) VALUES (%s, LAST_INSERT_ID(1)) "
        "ON DUPLICATE KEY UPDATE value = LAST_INSERT_ID(value + 1)"
    )

    def query_token(self, counter: str) -> int:
        self.query(self.fencing_sql, [counter])
        return int(self.query("SELECT LAST_INSERT_ID()", []))

    def try_lock(self, slot: str) -> bool:
        # 1: acquired, 0: busy, NULL: error (e.g. killed while waiting).
        return bool(self.query("SELECT GET_LOCK(%s, 0)", [short_name(slot, MAX_NAME)]) == 1)

    def unlock(self, slot: str) -> bool:
        # 1: released; 0: held by another session; NULL: nobody holds it (ours expired
        # with our session). Only 1 means it was still ours.
        return bool(self.query("SELECT RELEASE_LOCK(%s)", [short_name(slot, MAX_NAME)]) == 1)

    def is_mine(self, slot: str) -> bool:
        mine = self.query("SELECT IS_USED_LOCK(%s) = CONNECTION_ID()", [short_name(slot, MAX_NAME)])
        return bool(mine == 1)

    def connection_id(self) -> int:
        """This holder's session id (what ``KILL`` and ``IS_USED_LOCK`` show)."""
        return int(self.query("SELECT CONNECTION_ID()", []))
