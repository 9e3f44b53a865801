"""Redis lock pitfalls: leases, tokens, lost locks. Runs in the SQLite run only (the
Redis server is the same for every run)."""

from __future__ import annotations

import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.test import override_settings

from django_dbqueue.checks import check_lock_settings
from django_dbqueue.locks import BaseLock, LockLost, LockNotAcquired, named_lock
from django_dbqueue.locks.redis import RedisLock, redis_client, redis_key
from tests.support import wait_until
from tests.support.lock_procs import run_lock_workers

pytestmark = pytest.mark.only_vendor("sqlite")


@pytest.fixture
def lock_name() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


def redis_lock(name: str, **options: Any) -> RedisLock:
    lock = RedisLock(name, **options)
    assert lock.acquire(blocking=False)
    return lock


@pytest.mark.parametrize("limit", [1, 3])
def test_release_after_the_lease_ran_out_never_removes_the_next_holders_lock(
    lock_name: str, limit: int
) -> None:
    stale = redis_lock(lock_name, timeout=0.2, limit=limit)
    others = [redis_lock(lock_name, timeout=30, limit=limit) for _ in range(limit - 1)]
    time.sleep(0.3)
    successor = redis_lock(lock_name, timeout=30, limit=limit)
    with pytest.raises(LockLost, match="cannot extend"):
        stale.extend()
    with pytest.raises(LockLost, match="was lost before release"):
        stale.release()
    assert stale.lost
    assert successor.owned(), "the late release left the next holder's lock alone"
    assert all(other.owned() for other in others)
    for lock in [successor, *others]:
        lock.release()


def test_extend_keeps_the_lease_and_the_key_uses_the_lock_prefix(lock_name: str) -> None:
    lock = redis_lock(lock_name, timeout=0.3)
    key = redis_key("mutex", lock_name)
    assert key == f"dbqueue:lock:mutex:{lock_name}".encode()
    assert redis_client().get(key) == lock.token.encode()
    lock.extend(5)
    assert 4000 < redis_client().pttl(key) <= 5000
    time.sleep(0.4)
    assert lock.owned()
    lock.release()
    assert redis_client().get(key) is None


def test_each_acquisition_has_its_own_token_even_in_one_thread(lock_name: str) -> None:
    shared = named_lock(lock_name, limit=2)
    with shared as first, shared as second:
        assert first.token != second.token
    with shared as third:
        assert third.token not in (first.token, second.token)


def test_one_shared_named_lock_excludes_between_threads(lock_name: str) -> None:
    shared = named_lock(lock_name, blocking=False)
    inside, leave = threading.Event(), threading.Event()

    def hold() -> None:
        with shared:
            inside.set()
            leave.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert inside.wait(10)
        with pytest.raises(LockNotAcquired, match="held by someone else"):
            with shared:
                pass
    finally:
        leave.set()
        holder.join()
    with shared as lock:
        assert lock.owned()


def test_auto_renew_keeps_a_lock_past_its_timeout(lock_name: str) -> None:
    with named_lock(lock_name, timeout=0.3, auto_renew=True) as lock:
        time.sleep(0.8)
        assert lock.owned() and not lock.lost
        with pytest.raises(LockNotAcquired, match="held by someone else"):
            with named_lock(lock_name, blocking=False):
                pass


def test_a_holder_whose_lease_was_lost_finds_out(lock_name: str) -> None:
    lost: list[BaseLock] = []
    with pytest.raises(LockLost, match="was lost"):
        with named_lock(lock_name, timeout=0.3, auto_renew=True, on_lost=lost.append) as lock:
            # What a cache.clear(), an eviction or a failover to a replica that had not
            # seen the key yet does to a held lock.
            redis_client().delete(redis_key("mutex", lock_name))
            wait_until(lambda: lost, timeout=5)
            assert lost == [lock] and lock.lost
            assert not lock.owned()
    # Without auto-renew the holder finds out when it checks or releases.
    lock = redis_lock(lock_name, timeout=0.1)
    time.sleep(0.2)
    assert not lock.owned()
    with pytest.raises(LockLost):
        lock.release()


@pytest.mark.django_db(transaction=True)
def test_without_the_lock_the_same_processes_do_lose_updates(
    lock_name: str, worker_env: Callable[..., dict[str, str]]
) -> None:
    """The control experiment: the multi-process test could catch a broken lock."""
    key = f"{lock_name}-value"
    run_lock_workers(
        worker_env(),
        4,
        backend="redis",
        name=lock_name,
        key=key,
        increment=True,
        lock=False,
        iterations=15,
        counter=f"{lock_name}-ids",
        counter_backend="redis",
    )
    assert int(redis_client().get(key)) < 60


def test_checks_report_a_lock_configuration_that_cannot_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django.conf import settings

    def ids(**dbqueue: Any) -> list[str]:
        with override_settings(DBQUEUE={**settings.DBQUEUE, **dbqueue}):
            return [message.id or "" for message in check_lock_settings()]

    assert ids() == []
    assert ids(LOCK_BACKEND="redis", LOCK_REDIS_ALIAS="nope") == ["django_dbqueue.E105"]
    assert ids(LOCK_BACKEND="redis", LOCK_REDIS_ALIAS="default") == [
        "django_dbqueue.E105"
    ]  # a LocMemCache
    assert ids(LOCK_BACKEND="mysql") == ["django_dbqueue.E103"]  # this run is SQLite
    assert ids(LOCK_BACKEND="postgres") == ["django_dbqueue.E103"]
    assert ids(LOCK_BACKEND="zookeeper") == ["django_dbqueue.E102"]
    assert ids(LOCK_RELEASE_IN_TRANSACTION="sometimes") == ["django_dbqueue.E101"]
    shared_cache = {
        **settings.CACHES,
        "sessions": {**settings.CACHES["redis"]},
    }
    with override_settings(CACHES=shared_cache):
        assert ids(LOCK_BACKEND="redis") == ["django_dbqueue.W101"]
    monkeypatch.setitem(sys.modules, "django_redis", None)  # as if not installed
    assert ids(LOCK_BACKEND="redis") == ["django_dbqueue.E104"]
    assert ids() == [], "no backend chosen, none used: nothing to report"
