"""Waking idle workers when jobs arrive, instead of waiting for their next poll.

PostgreSQL: ``LISTEN``/``NOTIFY`` on the job database. MySQL/MariaDB and SQLite: a Redis
channel, when ``DBQUEUE['WAKEUP_REDIS_ALIAS']`` names a django-redis cache. Otherwise
workers poll, quickly while busy and backing off to ``POLL_INTERVAL`` when idle.

Notifications are sent when the enqueueing transaction commits: a job that rolls back
wakes nobody. On PostgreSQL the INSERT itself calls ``pg_notify`` (:func:`notify_args`):
NOTIFY is transactional, delivered on commit and dropped on rollback, so it costs no
statement of its own. Redis is told from ``jobs_enqueued``, which fires on commit, as is
PostgreSQL for jobs that were not due when inserted. They are only a hint; polling stays
on as the safety net, so a lost notification delays a job by at most ``POLL_INTERVAL``.

A second channel announces paused and resumed queues: a worker hears it between claims
(:meth:`Listener.switched`, one non-blocking read) and re-reads the paused set before its
next claim, so a pause reaches busy workers at once rather than within ``POLL_INTERVAL``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any, Protocol

from django.db import connections, router
from django.utils import timezone

from django_dbqueue.conf import settings

logger = logging.getLogger("django_dbqueue.wakeup")
CHANNEL = "dbqueue_wakeup"
SWITCHES = "dbqueue_switches"  # queues paused or resumed


class Listener(Protocol):
    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds; True when jobs for our queues were announced,
        or one of our queues was paused or resumed."""

    def switched(self) -> bool:
        """Without blocking: was one of our queues paused or resumed since the last call?"""

    def close(self) -> None: ...


def _job_database() -> str:
    from django_dbqueue.models import Job

    return router.db_for_write(Job)


def _redis(alias: str) -> Any:
    from django_redis import get_redis_connection

    return get_redis_connection(alias)


def _redis_channel(name: str) -> str:
    """A channel under the cache's KEY_PREFIX and VERSION: projects (or test runs) that
    share one Redis server with their own prefixes do not wake each other's workers."""
    from django.core.cache import caches

    return str(caches[settings.WAKEUP_REDIS_ALIAS].make_key(name))


def method() -> str:
    """Which wake-up this configuration uses: "postgres", "redis" or "poll"."""
    if not settings.WAKEUP:
        return "poll"
    if connections[_job_database()].vendor == "postgresql":
        return "postgres"
    if settings.WAKEUP_REDIS_ALIAS:
        return "redis"
    return "poll"


def notify(queues: Iterable[str], channel: str = CHANNEL) -> None:
    """Tell idle workers of these queues that jobs are runnable now (or, on ``SWITCHES``,
    that the queues were paused or resumed)."""
    payload = ",".join(sorted(set(queues)))
    if not payload:
        return
    how = method()
    try:
        if how == "postgres":
            with connections[_job_database()].cursor() as cursor:
                cursor.execute("SELECT pg_notify(%s, %s)", [channel, payload])
        elif how == "redis":
            _redis(settings.WAKEUP_REDIS_ALIAS).publish(_redis_channel(channel), payload)
    except Exception as exc:  # a hint only: never fail the caller's request over it
        logger.warning("Could not notify workers (%s); they will find out by polling", exc)


# A job whose INSERT made its own pg_notify carries this attribute (True).
WOKEN = "_dbqueue_woken"


def notify_args(using: str, queue: str) -> tuple[str, str] | None:
    """(channel, payload) for the ``pg_notify`` of an INSERT into ``using`` of a job due
    now on ``queue``, or None where the wake-up is not PostgreSQL's."""
    if connections[using].vendor != "postgresql" or not settings.WAKEUP:
        return None
    if using != _job_database():
        return None
    return CHANNEL, queue


def on_queues_switched(sender: Any, queues: list[str], **kwargs: Any) -> None:
    notify(queues, SWITCHES)


def on_jobs_enqueued(sender: Any, jobs: list[Any], **kwargs: Any) -> None:
    now = timezone.now()
    due = {job.queue for job in jobs if job.run_after <= now and not job.__dict__.get(WOKEN, False)}
    if due:
        notify(due)


class _Heard:
    """What a listener's messages say, for our queues."""

    def __init__(self, queues: Iterable[str]) -> None:
        self.queues = set(queues)
        self._switched = False

    def heard(self, channel: str, payload: str) -> bool:
        """Note one message; True when it concerns our queues."""
        if not self.queues & set(payload.split(",")):
            return False
        if channel == SWITCHES:
            self._switched = True
        return True

    def take_switched(self) -> bool:
        switched, self._switched = self._switched, False
        return switched


class PostgresListener(_Heard):
    """A connection of its own that LISTENs; the worker's connection stays free."""

    def __init__(self, queues: Iterable[str]) -> None:
        import psycopg
        from psycopg import sql

        super().__init__(queues)
        conn = connections[_job_database()]
        params = conn.get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        self.conn = psycopg.connect(**params, autocommit=True)
        for channel in (CHANNEL, SWITCHES):
            self.conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))

    def _read(self, timeout: float, stop_after: int | None = None) -> bool:
        # Each notifies() generator holds the connection's lock until exhausted, so
        # read it to the end before the next one.
        found = [
            self.heard(n.channel, n.payload)
            for n in self.conn.notifies(timeout=timeout, stop_after=stop_after)
        ]
        return any(found)

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if self._read(left, stop_after=1):
                self._read(0)  # swallow the backlog too: one claim serves them all
                return True
        return False

    def switched(self) -> bool:
        self._read(0)
        return self.take_switched()

    def close(self) -> None:
        self.conn.close()


class RedisListener(_Heard):
    def __init__(self, queues: Iterable[str]) -> None:
        super().__init__(queues)
        self.pubsub = _redis(settings.WAKEUP_REDIS_ALIAS).pubsub(ignore_subscribe_messages=True)
        # Our channels under the cache's prefix -> the names heard() knows.
        self.names = {_redis_channel(name): name for name in (CHANNEL, SWITCHES)}
        self.pubsub.subscribe(*self.names)

    def _take(self, message: dict[str, Any]) -> bool:
        channel, data = message["channel"], message["data"]
        channel = channel.decode() if isinstance(channel, bytes) else str(channel)
        return self.heard(
            self.names.get(channel, channel),
            data.decode() if isinstance(data, bytes) else str(data),
        )

    def _backlog(self) -> None:
        while (message := self.pubsub.get_message(timeout=0)) is not None:
            self._take(message)

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            message = self.pubsub.get_message(timeout=left)
            if message is not None and self._take(message):
                self._backlog()  # swallow the backlog too: one claim serves them all
                return True
        return False

    def switched(self) -> bool:
        self._backlog()
        return self.take_switched()

    def close(self) -> None:
        self.pubsub.close()


def listen(queues: Iterable[str]) -> Listener | None:
    """A listener for this configuration, or None to poll."""
    how = method()
    try:
        if how == "postgres":
            return PostgresListener(queues)
        if how == "redis":
            return RedisListener(queues)
    except Exception as exc:
        logger.warning("Wake-up via %s unavailable (%s); polling instead", how, exc)
    return None
