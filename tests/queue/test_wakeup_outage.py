"""A hung or restarted Redis costs enqueue nothing but the wake-up (issue #25, item 1).

The Redis here is the test's own (tests/support/redis_server.py), SIGSTOPped and
restarted by the test; PostgreSQL wakes through LISTEN/NOTIFY, not Redis.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from django_dbqueue import enqueue
from django_dbqueue.models import Job
from django_dbqueue.queue import announce
from django_dbqueue.queue.breaker import CALL_TIMEOUT
from django_dbqueue.worker import wakeup
from django_dbqueue.worker.loop import Worker
from tests.support import jobs, wait_until
from tests.support.redis_server import own_redis

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.only_vendor("mysql", "sqlite"),
]

# What one enqueue may take at most here: the documented CALL_TIMEOUT plus room for a
# loaded machine, and far below what a hung Redis cost before (redis-py's 5 s, or forever).
BOUND = CALL_TIMEOUT + 1.0


def outage_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The breaker's warnings (the worker's listener says its own once, falling back to polling)."""
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("Redis wake-up")]


def heard_again(listener: wakeup.Listener) -> bool:
    enqueue(jobs.noop)
    return listener.wait(0.3)


def test_a_hung_redis_never_holds_enqueue_up_and_warns_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "django_dbqueue.wakeup")
    with own_redis(tmp_path, WAKEUP_REDIS_ALIAS="own_redis") as server:
        listener = wakeup.listen(["default"])
        assert listener is not None
        try:
            enqueue(jobs.noop)
            assert listener.wait(5.0), "the wake-up works before the outage"
            server.pause()
            # At least 100 enqueues, and past the coalescing window of the announcement
            # above: a fast machine enqueues 100 jobs within it, and announces none.
            past_window = time.monotonic() + 2 * announce.COALESCE
            slowest, enqueued = 0.0, 0
            while enqueued < 100 or time.monotonic() < past_window:
                started = time.monotonic()
                enqueue(jobs.noop)
                enqueued += 1
                slowest = max(slowest, time.monotonic() - started)
            assert slowest < BOUND
            assert len(outage_warnings(caplog)) == 1, "one warning for the outage"
            assert Job.objects.filter(status="queued").count() == 1 + enqueued
            # Workers poll meanwhile: nothing enqueued during the outage is lost.
            Worker(burst=True, handle_signals=False).run()
            assert Job.objects.filter(status="done").count() == 1 + enqueued
            server.resume()

            def recovered() -> bool:
                enqueue(jobs.noop)  # one past the cool-down starts the probe
                return len(outage_warnings(caplog)) >= 2

            wait_until(recovered, timeout=90, interval=0.2)
            wait_until(lambda: heard_again(listener), timeout=30)
        finally:
            server.resume()
            listener.close()
    said = outage_warnings(caplog)
    assert len(said) == 2
    assert "unavailable" in said[0]
    assert "available again" in said[1]


def test_a_restarted_redis_is_used_again(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "django_dbqueue.wakeup")
    with own_redis(tmp_path, WAKEUP_REDIS_ALIAS="own_redis") as server:
        enqueue(jobs.noop)  # the publishing connection exists before the restart
        server.restart()
        listener = wakeup.listen(["default"])
        assert listener is not None
        try:
            slowest = 0.0
            for _ in range(20):
                started = time.monotonic()
                enqueue(jobs.noop)
                slowest = max(slowest, time.monotonic() - started)
            assert slowest < BOUND
            wait_until(lambda: heard_again(listener), timeout=60)
        finally:
            listener.close()
    assert len(outage_warnings(caplog)) <= 2  # at most: unavailable, then available again
