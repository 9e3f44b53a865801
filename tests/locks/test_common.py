"""Named-lock behaviour every backend must have.

Each database run tests the backend that goes with it: the SQLite run tests Redis, the
MySQL run GET_LOCK, the PostgreSQL run advisory locks.
"""

from __future__ import annotations

import time
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.db import transaction
from django.test import Client, override_settings

from django_dbqueue.checks import check_lock_settings
from django_dbqueue.conf import settings as dbqueue_settings
from django_dbqueue.exceptions import RetryJob
from django_dbqueue.locks import (
    LockNotAcquired,
    LockNotHeld,
    LockReleasedBeforeCommit,
    LockReleasedBeforeCommitWarning,
    named_lock,
    next_counter_value,
)
from django_dbqueue.models import Counter
from tests.support.lock_procs import max_overlap, run_lock_workers


def counter_backend(backend: str) -> str:
    return "redis" if backend == "redis" else "database"


@pytest.mark.django_db(transaction=True)
def test_processes_under_the_lock_never_lose_an_update(
    backend: str, lock_name: str, worker_env: Callable[..., dict[str, str]]
) -> None:
    key = f"{lock_name}-value"
    if backend != "redis":
        Counter.objects.create(name=key, value=0)
    workers, iterations = 4, 15
    reports = run_lock_workers(
        worker_env(LOCK_BACKEND=backend),
        workers,
        backend=backend,
        name=lock_name,
        key=key,
        increment=True,
        iterations=iterations,
        counter=f"{lock_name}-ids",
        counter_backend="database",
    )
    total = workers * iterations
    if backend == "redis":
        from django_dbqueue.locks.redis import redis_client

        final = int(redis_client().get(key))
    else:
        final = Counter.objects.get(name=key).value
    assert final == total, "every read-modify-write under the lock counted"
    assert max_overlap(reports) == 1
    # Fencing tokens grow with the order in which holders got the lock.
    by_time = [r["token"] for r in sorted(reports, key=lambda r: r["start"])]
    assert by_time == sorted(by_time) and len(set(by_time)) == total
    # The database counter, drawn concurrently outside the lock, never repeats a value.
    assert sorted(r["drawn"] for r in reports) == list(range(1, total + 1))


@pytest.mark.django_db(transaction=True)
def test_semaphore_never_exceeds_its_limit_and_reaches_it(
    backend: str, lock_name: str, worker_env: Callable[..., dict[str, str]], tmp_path: Path
) -> None:
    # "Reaches it" is not left to timing: the first three holders wait for each other
    # (a file barrier) while holding, so three overlap for certain; the other two
    # processes pass the barrier at once and can only take a slot a holder gave back.
    reports = run_lock_workers(
        worker_env(LOCK_BACKEND=backend),
        5,
        backend=backend,
        name=lock_name,
        limit=3,
        hold=0.25,
        iterations=3,
        counter=f"{lock_name}-ids",
        counter_backend=counter_backend(backend),
        barrier=str(tmp_path),
        meet=3,
    )
    assert len(reports) == 15
    assert max_overlap(reports) == 3


@pytest.mark.django_db
def test_blocking_timeout_is_honoured(backend: str, lock_name: str) -> None:
    with named_lock(lock_name):
        started = time.monotonic()
        with pytest.raises(LockNotAcquired, match=r"gave up after 0\.4 s"):
            with named_lock(lock_name, blocking_timeout=0.4):
                pass
        waited = time.monotonic() - started
        assert 0.4 <= waited < 1.5
        started = time.monotonic()
        with pytest.raises(LockNotAcquired, match="blocking=False"):
            with named_lock(lock_name, blocking=False):
                pass
        assert time.monotonic() - started < 0.3
    with named_lock(lock_name, blocking=False) as lock:
        assert lock.owned()


@pytest.mark.django_db
def test_semaphore_admits_limit_holders_in_one_process(backend: str, lock_name: str) -> None:
    first = named_lock(lock_name, limit=2, blocking=False).acquire(lock_name)
    second = named_lock(lock_name, limit=2, blocking=False).acquire(lock_name)
    with pytest.raises(LockNotAcquired, match="2 holders"):
        named_lock(lock_name, limit=2, blocking=False).acquire(lock_name)
    first.release()
    third = named_lock(lock_name, limit=2, blocking=False).acquire(lock_name)
    assert second.owned() and third.owned() and not first.owned()
    second.release()
    third.release()
    with pytest.raises(LockNotHeld):
        third.release()


@pytest.mark.django_db
@pytest.mark.parametrize(
    "odd_name",
    ['it\'s a "quoted" `name`; DROP TABLE x; --', "ключ-锁-🔒", "x" * 300],
)
def test_awkward_lock_names_work(backend: str, odd_name: str) -> None:
    name = f"{odd_name}{uuid.uuid4().hex[:8]}"
    with named_lock(name) as lock:
        assert lock.owned()
        with pytest.raises(LockNotAcquired):
            with named_lock(name, blocking=False):
                pass
        # A name that differs only at its end is another lock, even once names are hashed.
        with named_lock(name[:-1] + "!", blocking=False) as other:
            assert other.owned()
    with named_lock(name, blocking=False, limit=2) as slot:
        assert slot.owned()


@pytest.mark.django_db
def test_fencing_tokens_increase_with_each_acquisition(backend: str, lock_name: str) -> None:
    tokens = []
    for _ in range(3):
        with named_lock(lock_name, fencing=True) as lock:
            tokens.append(lock.fencing_token)
    with named_lock(lock_name) as lock:
        assert lock.fencing_token is None
    assert tokens[0] is not None and tokens == [tokens[0], tokens[0] + 1, tokens[0] + 2]


@pytest.mark.django_db(transaction=True)
def test_releasing_inside_a_transaction_is_flagged(backend: str, lock_name: str) -> None:
    with pytest.warns(LockReleasedBeforeCommitWarning, match="still open"):
        with transaction.atomic():
            with named_lock(lock_name):
                Counter.objects.create(name=lock_name, value=1)
    # The lock was still released: flagging never leaves it held.
    with named_lock(lock_name, blocking=False):
        pass
    with override_settings(
        DBQUEUE={**dbqueue_settings_dict(), "LOCK_RELEASE_IN_TRANSACTION": "raise"}
    ):
        with pytest.raises(LockReleasedBeforeCommit):
            with transaction.atomic():
                with named_lock(lock_name):
                    pass
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # The right order: commit first, then release. And an explicit opt-out.
        with named_lock(lock_name):
            with transaction.atomic():
                Counter.objects.filter(name=lock_name).update(value=2)
        with transaction.atomic():
            with named_lock(lock_name, release_in_transaction="ignore"):
                pass


def dbqueue_settings_dict() -> dict[str, Any]:
    from django.conf import settings

    return dict(settings.DBQUEUE)


@pytest.mark.django_db
def test_decorator_builds_the_name_from_arguments_and_retries_jobs(
    backend: str, lock_name: str
) -> None:
    @named_lock(lock_name + ":{item_id}", blocking=False, on_fail="retry", retry_delay=7)
    def fetch(item_id: int, page: int = 1) -> str:
        return f"fetched {item_id}/{page}"

    assert fetch(1) == "fetched 1/1"
    with named_lock(f"{lock_name}:1"):
        with pytest.raises(RetryJob) as retry:
            fetch(1, page=2)
        assert retry.value.delay == 7.0
        assert fetch(2) == "fetched 2/1", "another id is another lock"
    with pytest.raises(ValueError, match="has no argument 'itemid'"):
        named_lock("x:{itemid}")(fetch)


@pytest.mark.django_db
def test_view_answers_423_while_its_lock_is_held(backend: str, client: Client) -> None:
    pk = int(time.time() * 1000) % 10**9
    assert client.get(f"/locks/report/{pk}/").status_code == 200
    with named_lock(f"report:{pk}"):
        response = client.get(f"/locks/report/{pk}/")
        assert response.status_code == 423
        assert response["Retry-After"] == "5"
        assert b"busy" in response.content
        assert client.get(f"/locks/report/{pk + 1}/").status_code == 200
    assert client.get(f"/locks/report/{pk}/").status_code == 200


@pytest.mark.django_db(transaction=True)
def test_counter_wraps_around_within_its_range(backend: str, lock_name: str) -> None:
    for kind in sorted({"database", counter_backend(backend)}):
        name = f"{lock_name}-{kind}"
        drawn = [next_counter_value(name, min_value=5, max_value=7, backend=kind) for _ in range(5)]
        assert drawn == [5, 6, 7, 5, 6]
    with pytest.raises(ValueError, match="min_value <= max_value"):
        next_counter_value(lock_name, min_value=3, max_value=2)


def test_bad_arguments_are_refused_with_a_clear_error(backend: str) -> None:
    with pytest.raises(ValueError, match="non-empty string"):
        named_lock("")
    with pytest.raises(ValueError, match="on_fail must be"):
        named_lock("x", on_fail=200)
    with pytest.raises(ValueError, match="Unknown lock backend 'memcached'"):
        with named_lock("x", backend="memcached"):
            pass
    with pytest.raises(ValueError, match="limit must be an integer >= 1"):
        with named_lock("x", limit=0):
            pass
    with pytest.raises(ValueError, match="timeout must be"):
        with named_lock("x", timeout=-1):
            pass
    assert dbqueue_settings.LOCK_BACKEND == backend


@pytest.mark.only_vendor("mysql", "postgres")
def test_checks_and_backends_refuse_a_database_of_another_vendor(backend: str) -> None:
    from django.conf import settings

    other = {"mysql": "postgres", "postgres": "mysql"}[backend]

    def ids(name: str) -> list[str]:
        with override_settings(DBQUEUE={**settings.DBQUEUE, "LOCK_BACKEND": name}):
            return [message.id or "" for message in check_lock_settings()]

    assert ids(backend) == []
    assert ids(other) == ["django_dbqueue.E103"]
    with pytest.raises(ValueError, match=f"The {other} lock backend needs"):
        with named_lock("x", backend=other):
            pass


def test_default_lock_backend_follows_the_database() -> None:
    from django.conf import settings
    from django.db import connection

    from django_dbqueue.locks.named import default_backend_name

    with override_settings(DBQUEUE={**settings.DBQUEUE, "LOCK_BACKEND": None}):
        expected = {"mysql": "mysql", "postgresql": "postgres"}.get(connection.vendor, "redis")
        assert default_backend_name() == expected
        assert check_lock_settings() == [], "an unset backend is never held against a project"
    with override_settings(DBQUEUE={**settings.DBQUEUE, "LOCK_BACKEND": "redis"}):
        assert default_backend_name() == "redis"
