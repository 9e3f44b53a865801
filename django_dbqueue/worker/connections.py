"""Database connections of long-running processes: which errors to wait out, and reconnecting."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from django.db import DatabaseError, InterfaceError, OperationalError, connections, router

from django_dbqueue.conf import settings
from django_dbqueue.models import Job
from django_dbqueue.queue.dialects import dialect

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


# Above this share of the server's max_connections, run_jobs warns: the app's own
# processes, the admin and a second host need connections too.
CONNECTIONS_WARNING = 0.8


@dataclass
class Budget:
    """The connections one run_jobs opens to the job database, at most."""

    alias: str
    total: int
    explained: str
    server_max: int | None  # the server's max_connections (None: unknown, or SQLite)

    def line(self) -> str:
        limit = f"; the server allows {self.server_max}" if self.server_max else ""
        return (
            f"Connections to database {self.alias!r}: up to {self.total} ({self.explained}){limit}."
        )

    def too_many(self) -> bool:
        return bool(self.server_max) and self.total > CONNECTIONS_WARNING * self.server_max  # type: ignore[operator]


def budget(concurrency: int, threads: int) -> Budget:
    """The supervisor's one, and per child: its own, its LISTEN connection (PostgreSQL
    wake-up), and one per job thread (job code that queries opens its thread's own)."""
    alias = router.db_for_write(Job)
    conn = connections[alias]
    speaks = dialect(conn)
    listen = bool(settings.WAKEUP) and speaks.listen_notify
    parts = (
        ["worker"]
        + (["LISTEN"] if listen else [])
        + ([f"{threads} job threads"] if threads > 1 else [])
    )
    per_child = 1 + int(listen) + (threads if threads > 1 else 0)
    explained = f"1 supervisor + {concurrency} x {per_child}: {', '.join(parts)}"
    server_max = None
    if speaks.max_connections_sql:
        try:
            with conn.cursor() as cursor:
                cursor.execute(speaks.max_connections_sql)
                server_max = int(cursor.fetchone()[0])
        except DatabaseError:
            server_max = None  # unreachable now: the supervisor's start says so
    return Budget(alias, 1 + concurrency * per_child, explained, server_max)
