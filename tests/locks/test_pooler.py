"""The postgres lock backend refuses a database behind a pooler in transaction mode:
session advisory locks there would be lent to other clients with the server connection
(two holders at once). A direct connection is unchanged."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable

import pytest
from django.test import override_settings

from django_dbqueue.exceptions import LockConfigurationError
from django_dbqueue.locks import named_lock
from tests.support import ROOT
from tests.support.pgbouncer import PgBouncer

pytestmark = [pytest.mark.only_vendor("postgresql"), pytest.mark.django_db(transaction=True)]

# One attempt at the lock, in a process of its own: what it got, on one line.
TRY_LOCK = textwrap.dedent(
    """
    import os, sys, django
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    django.setup()
    from django_dbqueue.locks import LockConfigurationError, LockNotAcquired, named_lock
    try:
        with named_lock(sys.argv[1], backend="postgres", blocking_timeout=0):
            print("held")
    except LockConfigurationError as exc:
        print("refused:", exc)
    except LockNotAcquired:
        print("busy")
    """
)


def try_lock(name: str, env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-c", TRY_LOCK, name],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_named_lock_refuses_an_alias_behind_the_pooler(pgbouncer_alias: str) -> None:
    with pytest.raises(LockConfigurationError) as refused:
        with named_lock("pooled", backend="postgres", using=pgbouncer_alias):
            pytest.fail("the lock was taken through a transaction pooler")
    message = str(refused.value)
    for alternative in ("'redis'", "LOCK_DATABASE_ALIAS", "session mode", "pool_mode"):
        assert alternative in message, message
    # The default setting names the alias too.
    from django.conf import settings

    with override_settings(DBQUEUE={**settings.DBQUEUE, "LOCK_DATABASE_ALIAS": pgbouncer_alias}):
        with pytest.raises(LockConfigurationError):
            with named_lock("pooled", backend="postgres"):
                pytest.fail("the lock was taken through a transaction pooler")


def test_a_second_process_never_holds_what_the_first_holds(
    pgbouncer: PgBouncer, worker_env: Callable[..., dict[str, str]], lock_name: str
) -> None:
    direct = worker_env()
    pooled = pgbouncer.env(direct)
    # Through the pooler, nobody holds it: each attempt gets the clear error.
    for _ in range(3):
        assert try_lock(lock_name, pooled).startswith("refused: ")
    with named_lock(lock_name, backend="postgres") as held:  # direct, in this process
        assert held.owned()
        for _ in range(3):
            answer = try_lock(lock_name, pooled)
            assert answer.startswith("refused: "), answer
            assert "pool_mode = transaction" in answer
        assert try_lock(lock_name, direct) == "busy", "direct connections are unchanged"
        assert held.owned()
    assert try_lock(lock_name, direct) == "held"
