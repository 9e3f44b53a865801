"""The relay in-process (worker/relay.py): what a supervisor's listener hears reaches its
children's ears; a lost listener counts as a switch and is opened again."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.conf import settings as django_settings
from django.db import connection
from django.test import override_settings

from django_dbqueue import enqueue
from django_dbqueue.queue import pausing
from django_dbqueue.worker.relay import Ear, Relay
from tests.support import CURRENT_VENDOR, jobs, wait_until

pytestmark = pytest.mark.django_db(transaction=True)
WAKE = {} if CURRENT_VENDOR == "postgresql" else {"WAKEUP_REDIS_ALIAS": "redis"}


@contextmanager
def relayed(*queues: str, children: int = 2, **extra: object) -> Iterator[Relay]:
    with override_settings(DBQUEUE={**django_settings.DBQUEUE, **WAKE, **extra}):
        relay = Relay(list(queues), children)
        relay.start()
        try:
            yield relay
        finally:
            relay.stop()


def ears(relay: Relay) -> list[Ear]:
    found = [relay.ear(index) for index in range(2)]
    assert None not in found
    return [ear for ear in found if ear is not None]


def test_every_child_hears_the_jobs_of_the_hosts_queues_only() -> None:
    with relayed("default") as relay:
        first, second = ears(relay)
        subscribed = first.heard_at
        assert subscribed > 0, "listening before the children start"
        for ear in (first, second):
            ear.switched()  # what the start relayed is drained, as before a first claim
            assert not ear.wait(0.2)
        enqueue(jobs.noop, queue="emails")
        assert not first.wait(0.3), "another queue's job wakes nobody"
        enqueue(jobs.noop)
        assert first.wait(5.0) and second.wait(5.0)
        assert first.heard_at > subscribed
        assert not first.switched() and not first.wait(0.2), "one wake-up, read once"


def test_a_pause_reaches_every_child_as_a_switch() -> None:
    with relayed("default") as relay:
        first, second = ears(relay)
        assert not first.switched() and not second.switched()
        pausing.pause("default")
        assert first.wait(5.0)
        assert first.switched() and not first.switched()
        wait_until(second.switched, timeout=5)


@pytest.mark.only_vendor("postgresql")
def test_a_lost_listener_counts_as_a_switch_and_listens_again() -> None:
    with relayed("default") as relay:
        [ear, _] = ears(relay)
        ear.switched()
        subscribed = ear.heard_at
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND query LIKE 'LISTEN%%'"
                " AND pid <> pg_backend_pid()"
            )
            assert cursor.fetchone() == (True,)
        wait_until(ear.switched, timeout=10)  # a pause may have gone unheard
        wait_until(lambda: ear.heard_at > subscribed, timeout=10)  # listening again
        ear.switched()
        enqueue(jobs.noop)
        assert ear.wait(5.0)


def test_where_workers_poll_there_is_no_relay() -> None:
    with relayed("default", WAKEUP=False) as relay:
        assert not relay.on
        assert relay.ear(0) is None


def test_stop_ends_the_relays_wait_on_its_socket_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The relay thread waits on its listener's socket (the LISTEN connection's, the Redis
    subscription's) and on a pipe stop() writes to: it ends at once, not when its wait
    runs out (an hour here: stop() gives up on a thread after 5 s, which would then still
    be alive)."""
    from django_dbqueue.worker import relay as relay_module

    monkeypatch.setattr(relay_module, "SOCKET_SLICE", 3600.0)
    with relayed("default", children=1) as relay:
        thread, listener = relay._thread, relay._listener
        assert thread is not None and listener is not None
        assert getattr(listener, "fileno", lambda: None)() is not None, "a socket to wait on"
        ear = relay.ear(0)
        assert ear is not None
        enqueue(jobs.noop)  # heard through the socket; then the thread waits again
        assert ear.wait(10.0)
        relay.stop()
        assert not thread.is_alive()
        assert relay._listener is None
