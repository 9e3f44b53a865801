"""Database errors the queue treats apart: a deadlock the database resolved by rolling
the transaction back (retried where nothing else was rolled back with it), and a lock
wait that timed out (an operator action retries both, queue/conflicts.py)."""

from __future__ import annotations

# MySQL/MariaDB: "Deadlock found when trying to get lock" (the transaction was rolled back).
MYSQL_DEADLOCK = 1213


def is_deadlock(exc: BaseException) -> bool:
    """A deadlock the database resolved by rolling this transaction back."""
    code = exc.args[0] if exc.args else None
    if code == MYSQL_DEADLOCK:
        return True
    cause = exc.__cause__
    return getattr(cause, "sqlstate", None) == "40P01"  # PostgreSQL deadlock_detected


# MySQL/MariaDB: "Lock wait timeout exceeded" (only the statement was rolled back).
MYSQL_LOCK_WAIT_TIMEOUT = 1205


def is_lock_conflict(exc: BaseException) -> bool:
    """A deadlock, or a lock wait that timed out: another writer was in the way, and the
    same statement may well pass when tried again."""
    if is_deadlock(exc):
        return True
    code = exc.args[0] if exc.args else None
    if code == MYSQL_LOCK_WAIT_TIMEOUT:
        return True
    cause = exc.__cause__
    return getattr(cause, "sqlstate", None) == "55P03"  # PostgreSQL lock_not_available
