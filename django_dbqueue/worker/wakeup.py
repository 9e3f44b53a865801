"""Waking idle workers when jobs arrive, instead of waiting for their next poll.

PostgreSQL: ``LISTEN``/``NOTIFY`` on the job database. MySQL/MariaDB and SQLite: a Redis
channel, when ``DBQUEUE['WAKEUP_REDIS_ALIAS']`` names a django-redis cache. Otherwise
workers poll, quickly while busy and backing off to ``POLL_INTERVAL`` when idle.

Notifications are sent when the enqueueing transaction commits: a job that rolls back
wakes nobody. On PostgreSQL the INSERT itself calls ``pg_notify`` (:func:`notify_args`):
NOTIFY is transactional, delivered on commit and dropped on rollback, so it costs no
statement of its own. Redis is told by :func:`jobs_committed`, which enqueue calls on
commit, as is PostgreSQL for jobs whose INSERT did not notify. They are only a hint;
polling stays on as the safety net, so a lost notification delays a job by at most
``POLL_INTERVAL``.

A second channel announces paused and resumed queues: a worker hears it between claims
(:meth:`Listener.switched`, one non-blocking read) and re-reads the paused set before its
next claim, so a pause reaches busy workers at once rather than within ``POLL_INTERVAL``.

Coalescing. A process enqueueing in a tight loop would announce every job, and an
announcement costs more than a small INSERT (a Redis ``PUBLISH`` round trip; on
PostgreSQL the notification queue, its lock and a signal to every listener). So a
process announces the same queues on the same channel at most once per
:data:`COALESCE` seconds, and a worker that heard an announcement claims once more
:data:`COALESCE` after hearing it before it waits for the next one. Why no job is missed:

- An announcement counts from a time taken before it can be heard: before ``PUBLISH``
  is sent; for PostgreSQL, before the INSERT that carries the ``pg_notify``, and only
  once its transaction has committed. A job's announcement is skipped only when it was
  decided after the job committed (on commit, in :func:`jobs_committed`), less than
  :data:`COALESCE` after such an announcement A.
- Every idle worker of those queues was listening when A went out and hears it at some
  moment H after A's time; a busy one hears it at its next claim (or, with threads,
  when it next waits). Either way it begins a claim no earlier than H +
  :data:`COALESCE`, which is after the skipped job committed, so that claim sees the job
  (or another worker has taken it). A worker whose empty claim began before then claims
  once more at H + :data:`COALESCE` (worker/loop.py ``_idle``): a claim sees what was
  committed when it began, not when it returned.
- A worker that began listening after A went out counts the moment its subscription
  was confirmed as H, for the same reason.

A race between threads of one process may cost an extra announcement, never a missing
one: a time is recorded only after its announcement was sent (and committed).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple, Protocol

from django.db import connections, router
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone

from django_dbqueue.conf import PerSettings, settings
from django_dbqueue.queue.breaker import CircuitBreaker, bounded_redis

logger = logging.getLogger("django_dbqueue.wakeup")
CHANNEL = "dbqueue_wakeup"
SWITCHES = "dbqueue_switches"  # queues paused or resumed
# Seconds: a process announces jobs of the same queues at most once in this window, and
# a worker that heard an announcement claims again this long after hearing it (above).
COALESCE = 0.010


class Listener(Protocol):
    # time.monotonic() when this listener last heard jobs announced for its queues (at
    # first: when its subscription was confirmed). A claim after heard_at + COALESCE
    # sees every job whose announcement was coalesced into one heard by then.
    heard_at: float

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


class _Config(NamedTuple):
    """The wake-up settings, and the Redis channel names made under the cache's prefix."""

    wakeup: bool
    redis_alias: str | None
    redis_channels: dict[str, str]  # filled as names are asked for
    # alias -> the bounded client announcements are published with, and its breaker.
    publishers: dict[str, tuple[Any, CircuitBreaker]]


_config = PerSettings(
    lambda: _Config(bool(settings.WAKEUP), settings.WAKEUP_REDIS_ALIAS or None, {}, {}),
    "DBQUEUE",
    "CACHES",
)


def _publisher(alias: str) -> tuple[Any, CircuitBreaker]:
    """A publishing client that never holds an enqueue up (queue/breaker.py), and the
    breaker that skips Redis while it is down or hung."""
    publishers = _config().publishers
    found = publishers.get(alias)
    if found is None:
        client = bounded_redis(_redis(alias))
        breaker = CircuitBreaker(f"Redis wake-up (cache {alias!r})", probe=client.ping)
        found = publishers[alias] = (client, breaker)
    return found


def _redis_channel(name: str) -> str:
    """A channel under the cache's KEY_PREFIX and VERSION: projects (or test runs) that
    share one Redis server with their own prefixes do not wake each other's workers."""
    names = _config().redis_channels
    channel = names.get(name)
    if channel is None:
        from django.core.cache import caches

        channel = names[name] = str(caches[settings.WAKEUP_REDIS_ALIAS].make_key(name))
    return channel


def method(using: str | None = None) -> str:
    """Which wake-up this configuration uses: "postgres", "redis" or "poll".
    ``using``: the job database, when the caller knows it."""
    config = _config()
    if not config.wakeup:
        return "poll"
    if connections[using or _job_database()].vendor == "postgresql":
        return "postgres"
    if config.redis_alias:
        return "redis"
    return "poll"


# (how, where, payload) -> time.monotonic() taken before the last job announcement this
# process sent there (see "Coalescing" above); where: the job database's alias, or the
# Redis alias and channel. Plain dict operations, atomic under the GIL: a race between
# threads may keep an older time, which costs an extra announcement, never a missing one.
_announced: dict[tuple[str, str, str], float] = {}


def _announced_since(key: tuple[str, str, str], now: float, share: float = 1.0) -> bool:
    """Was ``key`` announced less than ``share`` of :data:`COALESCE` before ``now``?"""
    at = _announced.get(key)
    return at is not None and now - at < COALESCE * share


def _note_announced(key: tuple[str, str, str], at: float) -> None:
    if len(_announced) >= 1024:  # one entry per set of queues: only odd callers get here
        _announced.clear()
    if _announced.get(key, at) <= at:
        _announced[key] = at


def notify(queues: Iterable[str], channel: str = CHANNEL, using: str | None = None) -> None:
    """Tell idle workers of these queues that jobs are runnable now (or, on ``SWITCHES``,
    that the queues were paused or resumed). ``using``: the job database, if known.

    Job announcements (``CHANNEL``) must be made after the jobs committed: one made less
    than :data:`COALESCE` after the same one is skipped (see "Coalescing" above).
    Switches are never skipped: a pause and a resume a moment apart are both heard.
    """
    payload = ",".join(sorted(set(queues)))
    if not payload:
        return
    how = method(using)
    if how == "poll":
        return
    started = time.monotonic()
    try:
        if how == "postgres":
            using = using or _job_database()
            key = (how, using, payload)
            if channel == CHANNEL and _announced_since(key, started):
                return
            with connections[using].cursor() as cursor:
                cursor.execute("SELECT pg_notify(%s, %s)", [channel, payload])
        else:
            alias, name = _config().redis_alias or "", _redis_channel(channel)
            key = (how, f"{alias}:{name}", payload)
            if channel == CHANNEL and _announced_since(key, started):
                return
            client, breaker = _publisher(alias)
            if not breaker.allow(started):
                return
            try:
                client.publish(name, payload)
            except Exception as exc:
                breaker.failed(time.monotonic(), exc)  # warns once per outage
                return
            breaker.succeeded()
    except Exception as exc:  # a hint only: never fail the caller's request over it
        logger.warning("Could not notify workers (%s); they will find out by polling", exc)
        return
    if channel == CHANNEL:
        _note_announced(key, started)


# A job whose INSERT made its own pg_notify carries this attribute: the time.monotonic()
# taken before that INSERT, noted as the announcement's time once the job committed.
WOKEN = "_dbqueue_woken"


def notify_args(conn: BaseDatabaseWrapper, queue: str) -> tuple[str, str] | None:
    """(channel, payload) for the ``pg_notify`` of an INSERT on ``conn`` of a job due now
    on ``queue``, or None where the wake-up is not PostgreSQL's or the queue was
    announced less than half of :data:`COALESCE` ago. Half: whether the job still needs
    its own announcement is decided again on commit (:func:`jobs_committed`), against
    the whole window, and then it would cost a statement of its own."""
    if conn.vendor != "postgresql" or not _config().wakeup:
        return None
    if conn.alias != _job_database():
        return None
    if _announced_since(("postgres", conn.alias, queue), time.monotonic(), 0.5):
        return None
    return CHANNEL, queue


def on_queues_switched(sender: Any, queues: list[str], **kwargs: Any) -> None:
    notify(queues, SWITCHES)


def jobs_committed(jobs: Sequence[Any], using: str) -> None:
    """Announce jobs of the job database ``using`` whose transaction has just committed
    (enqueue calls it on commit, before sending ``jobs_enqueued``)."""
    if not _config().wakeup:
        return
    now = None
    due = set()
    for job in jobs:
        woken = job.__dict__.pop(WOKEN, None)
        if woken is not None:  # its INSERT's pg_notify went out with the commit
            _note_announced(("postgres", using, job.queue), woken)
            continue
        now = now or timezone.now()
        if job.run_after <= now:
            due.add(job.queue)
    if due:
        notify(due, using=using)


class _Heard:
    """What a listener's messages say, for our queues."""

    def __init__(self, queues: Iterable[str]) -> None:
        self.queues = set(queues)
        self._switched = False
        self.heard_at = time.monotonic()  # listeners set it again once subscribed

    def heard(self, channel: str, payload: str) -> bool:
        """Note one message; True when it concerns our queues."""
        if not self.queues & set(payload.split(",")):
            return False
        if channel == SWITCHES:
            self._switched = True
        else:
            self.heard_at = time.monotonic()
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
        # In autocommit, LISTEN has taken effect when its statement returns.
        self.heard_at = time.monotonic()

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
    CONFIRM_WITHIN = 5.0  # seconds for Redis to confirm the subscription

    def __init__(self, queues: Iterable[str]) -> None:
        super().__init__(queues)
        self.pubsub = _redis(settings.WAKEUP_REDIS_ALIAS).pubsub()
        # Our channels under the cache's prefix -> the names heard() knows.
        self.names = {_redis_channel(name): name for name in (CHANNEL, SWITCHES)}
        try:
            self.pubsub.subscribe(*self.names)
            self._confirmed()
        except BaseException:
            self.pubsub.close()
            raise

    def _confirmed(self) -> None:
        """Wait for the server to confirm our subscriptions: SUBSCRIBE is only sent, and
        a message published before the server took it is not ours to hear."""
        confirmed = 0
        deadline = time.monotonic() + self.CONFIRM_WITHIN
        while confirmed < len(self.names):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("Redis did not confirm the wake-up subscription")
            message = self.pubsub.get_message(timeout=left)
            if message is not None:
                if message["type"] == "subscribe":
                    confirmed += 1
                self._take(message)

    def _take(self, message: dict[str, Any]) -> bool:
        kind = message["type"]
        if kind == "subscribe":
            # Subscribed (again, after redis-py reconnected): what was published before
            # went unheard, so this counts as hearing it (see "Coalescing" above).
            self.heard_at = time.monotonic()
            return True
        if kind != "message":  # unsubscribe confirmations, pongs
            return False
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
