"""Database connections of long-running processes: which errors to wait out, and reconnecting."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from django.core.signals import setting_changed
from django.db import DatabaseError, InterfaceError, OperationalError, connections, router
from django.db.backends.base.base import BaseDatabaseWrapper
from django.dispatch import receiver

from django_dbqueue.conf import settings
from django_dbqueue.models import Job
from django_dbqueue.queue.conflicts import conflict_pause, note_conflict
from django_dbqueue.queue.dialects import dialect, is_lock_conflict
from django_dbqueue.worker.wakeup import behind_pooler

T = TypeVar("T")

# "The database is busy or briefly gone": MySQL 1213 (deadlock) and 1205 (lock wait
# timeout), 2006/2013 (server gone away, lost connection), SQLite "database is locked",
# a PostgreSQL restart. Django raises all of them as OperationalError or InterfaceError.
# They are retried at the top of the worker loop, never inside a caller's transaction
# (DatabaseWaits: conflicts quietly, an outage said once).
TRANSIENT_ERRORS: tuple[type[Exception], ...] = (OperationalError, InterfaceError)


def refresh_connections() -> None:
    """Drop connections that saw an error and no longer work, so the next query reconnects.

    Unlike ``close_old_connections()`` this keeps healthy connections open whatever
    CONN_MAX_AGE says: a worker reconnecting before every job would spend its time
    connecting. Called before every job: it looks at this thread's connection objects
    (:func:`_thread_connections`), not at ``connections.all()``, which costs 2.6 µs.
    """
    for conn in _thread_connections():
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


_local = threading.local()
_databases_changed = 0  # bumped when a test changes DATABASES: look the objects up again


def _thread_connections() -> list[BaseDatabaseWrapper]:
    """This thread's connection object of every alias. Django keeps one object per alias
    and thread, opened and closed in place, so the list holds until DATABASES changes."""
    cached = getattr(_local, "connections", None)
    if cached is None or cached[0] != _databases_changed:
        cached = (_databases_changed, [connections[alias] for alias in connections])
        _local.connections = cached
    return cached[1]


@receiver(setting_changed)
def _forget_connections(setting: str, **kwargs: object) -> None:
    global _databases_changed
    if setting == "DATABASES":
        _databases_changed += 1


MAX_BACKOFF = 5.0  # seconds between two tries while the database is away


def backoff(failures: int) -> float:
    return float(min(MAX_BACKOFF, 0.1 * 2 ** min(failures, 6)))


def database_address() -> str:
    """Where the queue's database is (host, port, name; never credentials)."""
    params = connections[router.db_for_write(Job)].settings_dict
    where = f"{params.get('HOST') or 'localhost'}:{params.get('PORT') or 'default port'}"
    return f"{where}, database {params.get('NAME')!r}"


class DatabaseWaits:
    """How a long-running loop waits out the database's transient errors, one error at
    a time (:meth:`failed` gives the pause), until :meth:`succeeded`.

    A conflict (a deadlock, a lock wait timeout, a Galera node refusing a commit that lost
    certification) is routine with several workers: counted and logged at DEBUG
    (:func:`~django_dbqueue.queue.conflicts.note_conflict`), tried again after a short
    jittered pause. Anything else (a server gone away, a node that died) is said once per
    outage, with the address waited for, and tried again with a jittered backoff capped
    at :data:`MAX_BACKOFF`; the next lines of the same outage are DEBUG.
    """

    def __init__(
        self, who: str, logger: logging.Logger, worker: str | None = None, where: str = "worker"
    ) -> None:
        self.who = who
        self.where = where  # what the conflicts are counted under: claim, record, ...
        self.logger = logger
        self.extra = {"event": "db_error", **({"worker": worker} if worker else {})}
        self.failures = 0
        self.conflicts = 0
        self.away = False

    def failed(self, exc: BaseException) -> float:
        if is_lock_conflict(exc):
            self.conflicts += 1
            note_conflict(self.where, exc, self.who)
            return conflict_pause(self.conflicts)
        self.failures += 1
        pause = backoff(self.failures) * random.uniform(0.75, 1.0)
        if self.away:
            self.logger.debug("%s: database error (%s); retrying in %.1f s", self.who, exc, pause)
        else:
            self.away = True
            self.logger.warning(
                "%s: database error (%s); retrying in %.1f s, then less often (at most "
                "every %g s), waiting for %s",
                self.who,
                exc,
                pause,
                MAX_BACKOFF,
                database_address(),
                extra=self.extra,
            )
        return pause

    def succeeded(self) -> None:
        if self.away:
            self.logger.warning("%s: the database answers again", self.who, extra=self.extra)
        self.failures = self.conflicts = 0
        self.away = False


def retry_transient(
    write: Callable[[], T],
    logger: logging.Logger,
    what: str,
    give_up_at: Callable[[], float | None] = lambda: None,
    where: str = "worker",
) -> T:
    """Run ``write`` until the database takes it, pausing as :class:`DatabaseWaits` says.

    For guarded writes only (see :mod:`django_dbqueue.queue.finish`): repeating one that
    did reach the database before the connection broke changes nothing. Raises the last
    error once ``give_up_at()`` (a ``time.monotonic()`` value) has passed.
    """
    waits = None  # made at the first error: the usual write pays nothing for it
    while True:
        try:
            result = write()
        except TRANSIENT_ERRORS as exc:
            deadline = give_up_at()
            if deadline is not None and time.monotonic() > deadline:
                raise
            waits = waits or DatabaseWaits(what, logger, where=where)
            pause = waits.failed(exc)
            refresh_connections()
            time.sleep(pause)
        else:
            if waits is not None:
                waits.succeeded()
            return result


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


def budget(concurrency: int, threads: int, claims: bool = False) -> Budget:
    """The supervisor's own, its LISTEN and (``claims``: it claims for its children,
    worker/handout.py's ``hands_out``) its claimer's connection
    (:func:`supervisor_connections`), and per child what :func:`child_connections` counts."""
    alias = router.db_for_write(Job)
    listen = listens(alias)
    parts = ["worker"] + ([f"{threads} job threads"] if threads > 1 else [])
    per_child = child_connections(threads)
    relayed = " + 1 LISTEN (relayed to the children)" if listen else ""
    claimer = " + 1 claiming for the children" if claims else ""
    explained = f"1 supervisor{relayed}{claimer} + {concurrency} x {per_child}: {', '.join(parts)}"
    total = supervisor_connections(listen, claims) + concurrency * per_child
    return Budget(alias, total, explained, server_max_connections(alias))


def supervisor_connections(listen: bool, claims: bool = False) -> int:
    """A supervisor's connections (an unsupervised worker's too): its own, the host's
    one LISTEN connection (``listen``: see :func:`listens`), which it holds for all its
    children (worker/relay.py), and its claimer's (``claims``: worker/handout.py)."""
    return 1 + int(listen) + int(claims)


def child_connections(threads: int = 1) -> int:
    """A child's connections: its own, and one per job thread (job code that queries
    opens its thread's own). It hears wake-ups from its supervisor, without a connection."""
    return 1 + (threads if threads > 1 else 0)


def listens(alias: str) -> bool:
    """Does a supervisor (or an unsupervised worker) on job database ``alias`` hold a
    LISTEN connection (the PostgreSQL wake-up, unless a pooler in transaction mode makes
    the workers poll)?"""
    speaks = dialect(connections[alias])
    return bool(settings.WAKEUP) and speaks.listen_notify and not _pooled(alias)


def server_max_connections(alias: str) -> int | None:
    """The server's ``max_connections`` (None: SQLite, or the server cannot be reached)."""
    conn = connections[alias]
    query = dialect(conn).max_connections_sql
    if not query:
        return None
    try:
        with conn.cursor() as cursor:
            cursor.execute(query)
            return int(cursor.fetchone()[0])
    except DatabaseError:
        return None  # unreachable now: the supervisor's start says so


def _pooled(alias: str) -> bool:
    try:
        return behind_pooler(alias)
    except DatabaseError:
        return False  # unreachable now: each child asks when it listens
