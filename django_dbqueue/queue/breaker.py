"""A circuit breaker for optional services (the Redis wake-up), and a bounded Redis client.

A wake-up is a hint: workers poll anyway, so a lost one costs speed, never a job. What
it must never cost is the caller's request. So the call itself is bounded
(:func:`bounded_redis`: :data:`CALL_TIMEOUT` seconds to connect and to answer, no
retries), and after a failure the :class:`CircuitBreaker` opens: callers skip the
service at once for a cool-down that doubles from :data:`FIRST_COOLDOWN` up to
:data:`MAX_COOLDOWN` seconds while it keeps failing; then a probe (a Redis ``PING``) tries
the service from a thread of its own, so no caller waits on a service known to be down:
only the one call that finds an outage waits, at most :data:`CALL_TIMEOUT`. The outage is
logged once when it starts and once when it ends, never once per call.

Pure: no Django, no models; the clock is passed in, so it is tested without sleeping.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("django_dbqueue.wakeup")

#: Seconds a bounded call may wait for the service: to connect, and for each reply.
CALL_TIMEOUT = 0.05
FIRST_COOLDOWN = 0.5
MAX_COOLDOWN = 30.0


class CircuitBreaker:
    """Closed (calls go through) until a call fails; then open (calls are skipped) for a
    cool-down; then one trial: success closes it, failure opens it for twice as long.

    The trial is ``probe()`` run in a daemon thread when a probe is given (the caller that
    found the cool-down over skips, as during it), else the caller's own call. Thread-safe:
    while open, and during the one trial, every other caller skips.
    """

    def __init__(
        self,
        name: str,
        probe: Callable[[], object] | None = None,
        first_cooldown: float = FIRST_COOLDOWN,
        max_cooldown: float = MAX_COOLDOWN,
    ) -> None:
        self.name = name
        self.probe = probe
        self.first_cooldown = first_cooldown
        self.max_cooldown = max_cooldown
        self.cooldown = 0.0  # 0: closed
        self.retry_at = 0.0
        self.trying = False
        self.failures = 0  # failed calls in this outage
        self.lock = threading.Lock()

    @property
    def closed(self) -> bool:
        return self.cooldown == 0.0

    def allow(self, now: float) -> bool:
        """May a call be made at ``now`` (a ``time.monotonic()``)? When it returns True
        for an open breaker (no probe), the caller is the trial and must report how it
        went with :meth:`failed` or :meth:`succeeded`."""
        if self.closed:
            return True
        with self.lock:
            if self.trying or now < self.retry_at:
                return False
            self.trying = True
        if self.probe is None:
            return True
        threading.Thread(
            target=self.run_probe, args=(now,), name=f"probe {self.name}", daemon=True
        ).start()
        return False

    def run_probe(self, started: float) -> None:
        """The trial, begun at ``started``: the next cool-down counts from then."""
        assert self.probe is not None
        try:
            self.probe()
        except Exception as exc:
            self.failed(started, exc)
        else:
            self.succeeded()

    def failed(self, now: float, error: BaseException) -> None:
        """The call made at ``now`` failed: open (or stay open, for twice as long)."""
        with self.lock:
            first = self.closed
            self.failures += 1
            self.cooldown = (
                self.first_cooldown if first else min(self.cooldown * 2, self.max_cooldown)
            )
            self.retry_at = now + self.cooldown
            self.trying = False
        if first:
            logger.warning(
                "%s unavailable (%s): skipped for %g s at a time until it answers again; "
                "workers poll meanwhile",
                self.name,
                error,
                self.first_cooldown,
            )

    def succeeded(self) -> None:
        """The call went through: close, and say the outage is over if there was one."""
        if self.closed:
            return
        with self.lock:
            failures, self.failures = self.failures, 0
            self.cooldown, self.retry_at, self.trying = 0.0, 0.0, False
        logger.warning("%s available again after %d failed calls", self.name, failures)


def bounded_redis(client: Any, timeout: float = CALL_TIMEOUT) -> Any:
    """A redis-py client to the same server as ``client`` that waits at most ``timeout``
    seconds to connect and for each reply, and never retries (redis-py retries three
    times with a backoff by default). Its own connection pool: the original's
    connections keep their own timeouts."""
    # redis is an optional dependency (the [redis] extra), needed only here.
    from redis import Redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    pool = client.connection_pool
    kwargs = dict(pool.connection_kwargs)
    kwargs.update(
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
        retry_on_error=[],
    )
    try:
        new_pool = type(pool)(connection_class=pool.connection_class, **kwargs)
    except TypeError:
        # A pool that needs more than its connections' arguments (Sentinel's): keep the
        # client as it is; the breaker still limits the cost to one call per cool-down.
        return client
    return Redis(connection_pool=new_pool)
