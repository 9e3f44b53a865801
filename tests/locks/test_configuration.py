"""A lock backend that cannot work here says which setting is wrong and what it needs."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings

from django_dbqueue.checks import check_lock_settings
from django_dbqueue.locks import LockConfigurationError, LockError, named_lock, next_counter_value

LOCMEM = "django.core.cache.backends.locmem.LocMemCache"
NEEDS = "with BACKEND 'django_redis.cache.RedisCache'"


def advice() -> str:
    """How each run's error ends: the database's own locks, or why there are none."""
    own = {"mysql": "mysql", "postgresql": "postgres"}.get(connection.vendor)
    if own:
        return f", or set DBQUEUE['LOCK_BACKEND'] to {own!r} to use the locks of database " + (
            "'default'."
        )
    return " (database 'default' is sqlite, which has no locks of its own)."


def dbqueue(**options: Any) -> override_settings:
    return override_settings(DBQUEUE={**settings.DBQUEUE, **options})


def error_of(**options: Any) -> str:
    with dbqueue(**options), pytest.raises(LockConfigurationError) as raised, named_lock("x"):
        pass
    return str(raised.value)


def test_redis_locks_on_a_cache_that_is_not_django_redis() -> None:
    message = error_of(LOCK_BACKEND="redis", LOCK_REDIS_ALIAS="default")
    assert message == (
        "Redis locks need a django-redis cache, but DBQUEUE['LOCK_REDIS_ALIAS'] is 'default', "
        f"whose BACKEND is {LOCMEM!r}: point it at a cache {NEEDS}" + advice()
    )


def test_redis_locks_on_a_cache_alias_that_does_not_exist() -> None:
    message = error_of(LOCK_BACKEND="redis", LOCK_REDIS_ALIAS="locks")
    assert message == (
        "Redis locks need a django-redis cache, but DBQUEUE['LOCK_REDIS_ALIAS'] is 'locks' and "
        f"CACHES has no 'locks': add CACHES['locks'] {NEEDS}" + advice()
    )


def test_the_using_argument_is_named_when_it_is_the_wrong_alias() -> None:
    lock = named_lock("x", backend="redis", using="default")
    with pytest.raises(LockConfigurationError) as raised, lock:
        pass
    assert str(raised.value) == (
        "Redis locks need a django-redis cache, but using='default', "
        f"whose BACKEND is {LOCMEM!r}: point it at a cache {NEEDS}" + advice()
    )


def test_the_redis_counter_says_the_same() -> None:
    with dbqueue(LOCK_REDIS_ALIAS="default"), pytest.raises(LockConfigurationError) as raised:
        next_counter_value("ids", backend="redis")
    assert str(raised.value).startswith(
        "Redis locks need a django-redis cache, but DBQUEUE['LOCK_REDIS_ALIAS'] is 'default',"
    )


def test_redis_locks_without_django_redis_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "django_redis", None)  # as if not installed
    message = error_of(LOCK_BACKEND="redis")
    assert message == 'Redis locks need django-redis (pip install "django-dbqueue[redis]")' + (
        advice()
    )


@pytest.mark.only_vendor("sqlite")
def test_sqlite_without_a_lock_backend_gets_the_same_error() -> None:
    # Unset LOCK_BACKEND means the database's own locks; SQLite has none, so Redis.
    message = error_of(LOCK_BACKEND=None, LOCK_REDIS_ALIAS="default")
    assert message == (
        "Redis locks need a django-redis cache, but DBQUEUE['LOCK_REDIS_ALIAS'] is 'default', "
        f"whose BACKEND is {LOCMEM!r}: point it at a cache {NEEDS} (database 'default' is "
        "sqlite, which has no locks of its own)."
    )


def test_the_error_is_a_lock_error() -> None:
    assert issubclass(LockConfigurationError, LockError)


def test_the_system_check_reports_the_same_alias() -> None:
    with dbqueue(LOCK_BACKEND="redis", LOCK_REDIS_ALIAS="default"):
        found = [(m.id, m.msg) for m in check_lock_settings()]
    assert found == [
        (
            "django_dbqueue.E105",
            "DBQUEUE['LOCK_REDIS_ALIAS'] is 'default', which must be a django-redis cache in "
            f"CACHES (it is {LOCMEM}).",
        )
    ]
