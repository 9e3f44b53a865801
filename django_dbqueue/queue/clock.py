"""The database's clock: every time comparison of the queue reads it, never a host's.

Hosts disagree about the time; the database is the one clock they all share. A lease
written by one host and judged expired by another, a ``run_after`` written by a web
process and compared by a worker, a tick enqueued by whichever supervisor comes first:
each compares times written by different hosts, so each uses this clock.

Reading the server's clock on every comparison would cost a round trip each time. So a
process reads it once (:data:`REFRESH` seconds at most, or when a caller asks for a
fresh reading) and runs it forward with its own monotonic clock, which a host's
wall-clock jumps (NTP steps, an operator's ``date -s``) do not move. The server's answer
is taken as the time when the question was sent (the server read its clock later than
that), so the time given is never earlier than the server's, and later by at most the
round trip of that one ``SELECT``: a job may be claimed that much before its
``run_after``, as a claim's statement always could be on its way.

SQLite has no server: its ``CURRENT_TIMESTAMP`` is the host's clock, and with SQLite
there is only one host, so the clock is ``timezone.now()``.
"""

from __future__ import annotations

import time
from collections import deque
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any, NamedTuple

from django.apps import apps
from django.conf import settings as django_settings
from django.db import connections, router
from django.utils import timezone

from django_dbqueue.queue.dialects import dialect

# How long a reading of the server's clock is run forward before it is read again: the
# monotonic clock drifts by parts per million, the server's clock may be stepped.
REFRESH = 10.0


class Reading(NamedTuple):
    """One reading of the database's clock."""

    at: datetime  # the server's time, aware, UTC
    monotonic: float  # this process's monotonic clock when the question was sent
    offset: float  # seconds the database's clock is ahead of this host's (negative: behind)
    host: bool = False  # no server clock (SQLite): the time is the host's timezone.now()


_readings: dict[str, Reading] = {}
# The round trips of the last readings, per alias: the least is the network's share.
ROUND_TRIPS_KEPT = 6
_round_trips: dict[str, deque[float]] = {}


def read(using: str) -> Reading:
    """Read the server's clock now (one ``SELECT``), and keep the reading for :func:`now`."""
    conn = connections[using]
    sql = dialect(conn).clock_sql
    if not sql:
        host = datetime.now(UTC)
        reading = Reading(host, time.monotonic(), 0.0, host=True)
    else:
        with conn.cursor() as cursor:
            asked, host_time = time.monotonic(), time.time()
            cursor.execute(sql)
            value = cursor.fetchone()[0]
            trips = _round_trips.setdefault(using, deque(maxlen=ROUND_TRIPS_KEPT))
            trips.append(time.monotonic() - asked)
        at = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        reading = Reading(at, asked, at.timestamp() - host_time)
    _readings[using] = reading
    return reading


def reading(using: str, fresh: bool = False) -> Reading:
    """The last reading of ``using``'s clock, read again if older than :data:`REFRESH`
    seconds (or if ``fresh``)."""
    last = _readings.get(using)
    if fresh or last is None or time.monotonic() - last.monotonic > REFRESH:
        return read(using)
    return last


def round_trip(using: str) -> float:
    """Seconds a statement takes to come back from ``using``'s server, at least: the
    least of the last few clock readings' round trips (one every :data:`REFRESH` s; the
    first is read now). 0 for SQLite, which has no server."""
    trips = _round_trips.get(using)
    if trips is None or len(trips) < 2:
        read(using)  # a process's first reading may include its connection's warm-up
        trips = _round_trips.get(using)
    return min(trips) if trips else 0.0


def now(using: str, fresh: bool = False) -> datetime:
    """The database's time now, as ``timezone.now()`` gives it (aware in UTC, or naive in
    the project's zone when ``USE_TZ`` is off).

    On every enqueue (twice): the kept reading is looked up first, without the
    connection (a thread-local lookup) or its dialect."""
    last = reading(using, fresh)
    if last.host:
        return timezone.now()
    at = last.at + timedelta(seconds=time.monotonic() - last.monotonic)
    if django_settings.USE_TZ:
        return at
    return timezone.make_naive(at, timezone.get_default_timezone())


@cache
def _job_model() -> Any:
    # From the app registry (models.py stands on this room), once: a failed lookup
    # (the registry not ready yet) raises and is not kept.
    return apps.get_model("django_dbqueue", "Job")


def job_database() -> str:
    """The alias of the job database (where the router writes jobs)."""
    return router.db_for_write(_job_model())


def queue_now(fresh: bool = False) -> datetime:
    """:func:`now` of the job database."""
    return now(job_database(), fresh)


def offset(using: str) -> float:
    """Seconds the database's clock is ahead of this host's (negative: behind), from a
    fresh reading."""
    return read(using).offset


def forget() -> None:
    """Drop every reading (tests; a process that changed its connections)."""
    _readings.clear()
    _round_trips.clear()
