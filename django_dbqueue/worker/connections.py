"""Database connections of long-running processes: which errors to wait out, and reconnecting."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import DatabaseError, InterfaceError, OperationalError, connections

T = TypeVar("T")

# "The database is busy or briefly gone": MySQL 1213 (deadlock) and 1205 (lock wait
# timeout), 2006/2013 (server gone away, lost connection), SQLite "database is locked",
# a PostgreSQL restart. Django raises all of them as OperationalError or InterfaceError.
# They are retried at the top of the worker loop, never inside a caller's transaction.
TRANSIENT_ERRORS: tuple[type[Exception], ...] = (OperationalError, InterfaceError)


def refresh_connections() -> None:
    """Drop connections that saw an error and no longer work, so the next query reconnects.

    Unlike ``close_old_connections()`` this keeps healthy connections open whatever
    CONN_MAX_AGE says: a worker reconnecting before every job would spend its time
    connecting.
    """
    for conn in connections.all(initialized_only=True):
        if conn.connection is None or conn.in_atomic_block:
            continue
        try:
            if conn.errors_occurred:
                if conn.is_usable():
                    conn.errors_occurred = False
                else:
                    conn.close()
        except DatabaseError:
            conn.connection = None


def backoff(failures: int) -> float:
    return float(min(5.0, 0.1 * 2 ** min(failures, 6)))


def retry_transient(
    write: Callable[[], T],
    logger: logging.Logger,
    what: str,
    give_up_at: Callable[[], float | None] = lambda: None,
) -> T:
    """Run ``write`` until the database takes it, pausing longer after each failure.

    For guarded writes only (see :mod:`django_dbqueue.queue.finish`): repeating one that
    did reach the database before the connection broke changes nothing. Raises the last
    error once ``give_up_at()`` (a ``time.monotonic()`` value) has passed.
    """
    failures = 0
    while True:
        try:
            return write()
        except TRANSIENT_ERRORS as exc:
            failures += 1
            deadline = give_up_at()
            if deadline is not None and time.monotonic() > deadline:
                raise
            logger.warning(
                "%s: database error (%s); retrying in %.1f s",
                what,
                exc,
                backoff(failures),
                extra={"event": "db_error"},
            )
            refresh_connections()
            time.sleep(backoff(failures))
