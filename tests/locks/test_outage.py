"""A lock backend that is down fails closed with the library's own error, and Redis
fencing tokens never go backwards across a restart (issue #25, items 2 and 3).

The Redis here is the test's own (tests/support/redis_server.py): stopped, SIGSTOPped
and restarted by the test, never the shared one.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connections
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory, override_settings

from django_dbqueue.exceptions import RetryJob
from django_dbqueue.locks import LockBackendUnavailable, LockError, named_lock
from tests.support import CURRENT_VENDOR
from tests.support.redis_server import free_port, own_redis


@pytest.fixture
def lock_name() -> str:
    return f"faults-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def dead_redis() -> Iterator[str]:
    """A django-redis cache alias on a port nothing listens on."""
    port = free_port()
    caches = {
        **settings.CACHES,
        "dead_redis": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"redis://127.0.0.1:{port}/0",
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.2, "SOCKET_TIMEOUT": 0.2},
        },
    }
    with override_settings(CACHES=caches):
        yield f"127.0.0.1:{port}"


def test_redis_down_raises_the_libraries_error_naming_backend_and_address(
    dead_redis: str, lock_name: str
) -> None:
    with pytest.raises(LockBackendUnavailable) as caught:
        with named_lock(lock_name, backend="redis", using="dead_redis"):
            pytest.fail("the guarded block must not run")
    assert isinstance(caught.value, LockError)
    assert "redis lock backend at " + dead_redis in str(caught.value)
    assert "fails closed" in str(caught.value)


def test_on_fail_answers_for_a_backend_that_is_down(dead_redis: str, lock_name: str) -> None:
    ran = []

    @named_lock(lock_name, backend="redis", using="dead_redis", on_fail=429, retry_delay=3)
    def view(request: HttpRequest) -> HttpResponse:
        ran.append(request)
        return HttpResponse("ok")

    @named_lock(lock_name, backend="redis", using="dead_redis", on_fail="retry")
    def job() -> None:
        ran.append(job)

    response = view(RequestFactory().get("/"))
    assert response.status_code == 429
    assert response["Retry-After"] == "3"
    with pytest.raises(RetryJob):
        job()
    assert ran == []


@pytest.mark.django_db(transaction=True)
def test_a_hung_redis_fails_closed_within_the_caches_socket_timeout(
    tmp_path: Path, lock_name: str
) -> None:
    options = {"SOCKET_CONNECT_TIMEOUT": 0.2, "SOCKET_TIMEOUT": 0.2}
    with own_redis(tmp_path, options=options) as server:
        with named_lock(lock_name, backend="redis", using="own_redis") as lock:
            assert lock.owned()
        server.pause()
        try:
            with pytest.raises(LockBackendUnavailable, match=f"127.0.0.1:{server.port}"):
                with named_lock(lock_name, backend="redis", using="own_redis"):
                    pytest.fail("the guarded block must not run")
        finally:
            server.resume()


@pytest.mark.only_vendor("mysql", "postgres")
def test_lock_database_down_raises_the_libraries_error(
    lock_name: str, django_db_blocker: Any
) -> None:
    backend = {"mysql": "mysql", "postgresql": "postgres"}[CURRENT_VENDOR]
    port = free_port()
    connections.settings["faults_dead"] = {**connections.settings["default"], "PORT": port}
    try:
        with django_db_blocker.unblock(), pytest.raises(LockBackendUnavailable) as caught:
            with named_lock(lock_name, backend=backend, using="faults_dead"):
                pytest.fail("the guarded block must not run")
        assert f"{backend} lock backend at 127.0.0.1:{port}" in str(caught.value)
    finally:
        del connections.settings["faults_dead"]
        if hasattr(connections._connections, "faults_dead"):
            delattr(connections._connections, "faults_dead")


def take(lock_name: str, limit: int = 1) -> int:
    with named_lock(lock_name, using="own_redis", fencing=True, limit=limit) as lock:
        assert lock.fencing_token is not None
        return lock.fencing_token


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("limit", [1, 3])
def test_fencing_tokens_never_go_backwards_across_a_restart(
    tmp_path: Path, lock_name: str, limit: int
) -> None:
    with own_redis(tmp_path, LOCK_BACKEND="redis") as server:
        before = [take(lock_name, limit) for _ in range(5)]
        holder = named_lock(lock_name, using="own_redis", fencing=True, limit=limit)
        held = holder.__enter__()
        assert held.fencing_token is not None
        before.append(held.fencing_token)
        server.restart()  # no persistence: the lock, the fence key, everything is gone
        after = [take(lock_name, limit) for _ in range(3)]
        server.restart()
        after += [take(lock_name, limit) for _ in range(3)]
        held.held = False  # its key went with the restart: nothing left to release
    tokens = before + after
    assert tokens == sorted(set(tokens)), tokens
    assert before == list(range(before[0], before[0] + 6))
