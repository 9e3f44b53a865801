"""The sending half of the wake-up: telling idle workers that jobs arrived, or that
queues were paused or resumed, instead of leaving them to their next poll.

PostgreSQL: ``NOTIFY`` on the job database. MySQL/MariaDB and SQLite: a Redis channel,
when ``DBQUEUE['WAKEUP_REDIS_ALIAS']`` names a django-redis cache. Otherwise workers
poll, quickly while busy and backing off to ``POLL_INTERVAL`` when idle. The listening
half is worker/wakeup.py.

Notifications are sent when the enqueueing transaction commits: a job that rolls back
wakes nobody. On PostgreSQL the INSERT itself calls ``pg_notify`` (:func:`notify_args`):
NOTIFY is transactional, delivered on commit and dropped on rollback, so it costs no
statement of its own. Redis is told by :func:`jobs_committed`, which enqueue calls on
commit, as is PostgreSQL for jobs whose INSERT did not notify. They are only a hint;
polling stays on as the safety net, so a lost notification delays a job by at most
``POLL_INTERVAL``.

A second channel (:data:`SWITCHES`) announces paused and resumed queues
(:func:`on_queues_switched`, connected in apps.py).

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
  once more at H + :data:`COALESCE` (worker/listening.py ``Listening.idle``): a claim sees what was
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
from typing import Any, NamedTuple

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from django_dbqueue.conf import PerSettings, settings
from django_dbqueue.queue import clock
from django_dbqueue.queue.breaker import CircuitBreaker, bounded_redis
from django_dbqueue.queue.clock import job_database
from django_dbqueue.queue.dialects import dialect

logger = logging.getLogger("django_dbqueue.wakeup")
CHANNEL = "dbqueue_wakeup"
SWITCHES = "dbqueue_switches"  # queues paused or resumed
# Seconds: a process announces jobs of the same queues at most once in this window, and
# a worker that heard an announcement claims again this long after hearing it (above).
COALESCE = 0.010


def redis_client(alias: str) -> Any:
    """The Redis client of the django-redis cache ``alias`` (an optional package)."""
    from django_redis import get_redis_connection

    return get_redis_connection(alias)


class _Config(NamedTuple):
    """The wake-up settings, and the Redis channel names made under the cache's prefix."""

    wakeup: bool
    redis_alias: str | None
    redis_channels: dict[str, str]  # filled as names are asked for
    # alias -> the bounded client announcements are published with, and its breaker.
    publishers: dict[str, tuple[Any, CircuitBreaker]]
    # (job database, queues) -> the key of their job announcements in _announced, as
    # notify made it: what jobs_committed looks up before it calls notify.
    keys: dict[tuple[str, str], tuple[str, str, str]]
    # job database -> its wake-up (method()), found once: asked at every enqueue (an
    # alias's database does not change its vendor in a running process).
    methods: dict[str, str]


_config = PerSettings(
    lambda: _Config(bool(settings.WAKEUP), settings.WAKEUP_REDIS_ALIAS or None, {}, {}, {}, {}),
    "DBQUEUE",
    "CACHES",
)


def _publisher(alias: str) -> tuple[Any, CircuitBreaker]:
    """A publishing client that never holds an enqueue up (queue/breaker.py), and the
    breaker that skips Redis while it is down or hung."""
    publishers = _config().publishers
    found = publishers.get(alias)
    if found is None:
        client = bounded_redis(redis_client(alias))
        breaker = CircuitBreaker(f"Redis wake-up (cache {alias!r})", probe=client.ping)
        found = publishers[alias] = (client, breaker)
    return found


def redis_channel(name: str) -> str:
    """A channel under the cache's KEY_PREFIX and VERSION: projects (or test runs) that
    share one Redis server with their own prefixes do not wake each other's workers."""
    names = _config().redis_channels
    channel = names.get(name)
    if channel is None:
        from django.core.cache import caches

        channel = names[name] = str(caches[settings.WAKEUP_REDIS_ALIAS].make_key(name))
    return channel


def method(using: str | None = None, config: _Config | None = None) -> str:
    """Which wake-up this configuration uses: "postgres", "redis" or "poll".
    ``using``: the job database, when the caller knows it; ``config``: :func:`_config`'s,
    when the caller has it."""
    config = config or _config()
    if not config.wakeup:
        return "poll"
    database = using or job_database()
    how = config.methods.get(database)
    if how is None:
        if dialect(connections[database]).listen_notify:
            how = "postgres"
        else:
            how = "redis" if config.redis_alias else "poll"
        config.methods[database] = how
    return how


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
            database = using or job_database()
            key = (how, database, payload)
        else:
            alias, name = _config().redis_alias or "", redis_channel(channel)
            key = (how, f"{alias}:{name}", payload)
        if channel == CHANNEL:
            if using is not None:
                keys = _config().keys
                if len(keys) >= 1024:  # as _announced: only odd callers get here
                    keys.clear()
                keys[using, payload] = key
            if _announced_since(key, started):
                return
        if how == "postgres":
            with connections[database].cursor() as cursor:
                cursor.execute("SELECT pg_notify(%s, %s)", [channel, payload])
        else:
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
    if not dialect(conn).listen_notify or not _config().wakeup:
        return None
    if conn.alias != job_database():
        return None
    if _announced_since(("postgres", conn.alias, queue), time.monotonic(), 0.5):
        return None
    return CHANNEL, queue


def on_queues_switched(sender: Any, queues: list[str], **kwargs: Any) -> None:
    notify(queues, SWITCHES)


def jobs_committed(jobs: Sequence[Any], using: str) -> None:
    """Announce jobs of the job database ``using`` whose transaction has just committed
    (enqueue calls it on commit, before sending ``jobs_enqueued``)."""
    config = _config()
    if method(using, config) == "poll":
        return
    now = None
    due = set()
    for job in jobs:
        woken = job.__dict__.pop(WOKEN, None)
        if woken is not None:  # its INSERT's pg_notify went out with the commit
            _note_announced(("postgres", using, job.queue), woken)
            continue
        if job.run_after <= job.created_at:  # due when it was made: no clock to read
            due.add(job.queue)
            continue
        now = now or clock.now(using)
        if job.run_after <= now:
            due.add(job.queue)
    if due:
        if len(due) == 1:
            # An enqueue in a loop: its queue was announced a moment ago. Told apart here,
            # without notify's work (the payload, the wake-up's method, the channel).
            key = config.keys.get((using, next(iter(due))))
            if key is not None and _announced_since(key, time.monotonic()):
                return
        notify(due, using=using)
