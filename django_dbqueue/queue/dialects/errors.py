"""Database errors the queue treats apart: a deadlock the database resolved by rolling
the transaction back (retried where nothing else was rolled back with it)."""

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
