"""The listening half of the wake-up: idle workers wait for announcements of jobs (and
of paused or resumed queues) instead of sleeping until their next poll. A supervisor's
children do not listen themselves: the supervisor listens for them (worker/relay.py).

PostgreSQL: ``LISTEN`` on a connection of its own. MySQL/MariaDB and SQLite: a Redis
channel, when ``DBQUEUE['WAKEUP_REDIS_ALIAS']`` names a django-redis cache. Otherwise
:func:`listen` returns None and the worker polls. The sending half, and why coalesced
announcements miss no job, are in queue/announce.py.

A worker hears the switches channel between claims (:meth:`Listener.switched`, one
non-blocking read) and re-reads the paused set before its next claim, so a pause reaches
busy workers at once rather than within ``POLL_INTERVAL``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any, Protocol

from django_dbqueue.conf import settings
from django_dbqueue.queue.announce import (
    CHANNEL,
    COALESCE,
    SWITCHES,
    method,
    redis_channel,
    redis_client,
)
from django_dbqueue.queue.clock import job_database
from django_dbqueue.queue.dialects.pooler import own_connection, transaction_pooled

__all__ = ["CHANNEL", "COALESCE", "SWITCHES", "Listener", "close_quietly", "listen", "method"]
logger = logging.getLogger("django_dbqueue.wakeup")


class Listener(Protocol):
    @property
    def heard_at(self) -> float:
        """time.monotonic() when this listener last heard jobs announced for its queues
        (at first: when its subscription was confirmed). A claim after heard_at +
        COALESCE sees every job whose announcement was coalesced into one heard by then."""

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds; True when jobs for our queues were announced,
        or one of our queues was paused or resumed."""

    def switched(self) -> bool:
        """Without blocking: was one of our queues paused or resumed since the last call?"""

    def close(self) -> None: ...


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
        from psycopg import sql

        super().__init__(queues)
        self.conn = own_connection(job_database())
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
        """(With ``timeout`` 0, or once it has run out: everything that came in already,
        other queues' announcements included, is read.)"""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if self._read(left, stop_after=1):
                self._read(0)  # swallow the backlog too: one claim serves them all
                return True
        return self._read(0)

    def switched(self) -> bool:
        self._read(0)
        return self.take_switched()

    def fileno(self) -> int:
        """The connection's socket: readable when notifications may have come."""
        return int(self.conn.fileno())

    def close(self) -> None:
        self.conn.close()


class RedisListener(_Heard):
    CONFIRM_WITHIN = 5.0  # seconds for Redis to confirm the subscription

    def __init__(self, queues: Iterable[str]) -> None:
        super().__init__(queues)
        self.pubsub = redis_client(settings.WAKEUP_REDIS_ALIAS).pubsub()
        # Our channels under the cache's prefix -> the names heard() knows.
        self.names = {redis_channel(name): name for name in (CHANNEL, SWITCHES)}
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
        """(With ``timeout`` 0, or once it has run out: everything that came in already,
        other queues' announcements included, is read.)"""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            message = self.pubsub.get_message(timeout=max(0.0, left))
            if message is not None:
                if self._take(message):
                    self._backlog()  # swallow the backlog too: one claim serves them all
                    return True
            elif left <= 0:
                return False

    def switched(self) -> bool:
        self._backlog()
        return self.take_switched()

    def fileno(self) -> int | None:
        """The subscription's socket, or None where this redis-py does not show it (a
        private attribute: the relay then waits a quarter of a second at a time)."""
        sock = getattr(self.pubsub.connection, "_sock", None)
        return None if sock is None else int(sock.fileno())

    def close(self) -> None:
        self.pubsub.close()


def listen(queues: Iterable[str]) -> Listener | None:
    """A listener for this configuration, or None to poll."""
    how = method()
    try:
        if how == "postgres" and not behind_pooler(job_database()):
            return PostgresListener(queues)
        if how == "redis":
            return RedisListener(queues)
    except Exception as exc:
        logger.warning("Wake-up via %s unavailable (%s); polling instead", how, exc)
    return None


def close_quietly(listener: Listener) -> None:
    """Close a listener that may be broken (closing a lost connection may fail again)."""
    try:
        listener.close()
    except Exception:
        logger.debug("closing the wake-up listener failed", exc_info=True)


_pooled_said: set[str] = set()  # aliases whose pooler this process has warned about


def behind_pooler(alias: str) -> bool:
    """Does PostgreSQL alias ``alias`` go through a pooler in transaction mode, where
    ``LISTEN`` hears nothing? Says so once per process (run_jobs asks before it starts
    its children, which inherit the answer): the workers poll instead."""
    if not transaction_pooled(alias):
        return False
    if alias not in _pooled_said:
        _pooled_said.add(alias)
        logger.warning(
            "Database %r goes through a pooler in transaction mode (such as PgBouncer's "
            "pool_mode = transaction): LISTEN would hear no wake-up there, so workers poll "
            "every DBQUEUE['POLL_INTERVAL'] (%s s) instead. For wake-ups within "
            "milliseconds, give the queue an alias that reaches PostgreSQL directly or "
            "through session pooling (docs/databases.md, 'Poolers').",
            alias,
            settings.POLL_INTERVAL,
            extra={"event": "wakeup_pooler"},
        )
    return True
