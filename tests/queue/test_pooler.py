"""A PostgreSQL alias behind PgBouncer in transaction mode is told from a direct one
(queue/dialects/pooler.py), and ``check`` says what that changes (W521, W522)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest
from django.conf import settings
from django.core.checks import run_checks
from django.test import override_settings

from django_dbqueue.queue.dialects import pooler
from tests.support import ROOT
from tests.support.pgbouncer import PgBouncer

pytestmark = [pytest.mark.only_vendor("postgresql"), pytest.mark.django_db(transaction=True)]


def test_transaction_pooling_is_detected_and_a_direct_connection_is_not(
    pgbouncer_alias: str,
) -> None:
    for _ in range(3):  # not a lucky draw of the pool: the same answer every time
        pooler.forget()
        assert pooler.transaction_pooled(pgbouncer_alias) is True
        assert pooler.transaction_pooled("default") is False


def test_the_answer_is_asked_once_per_process(
    pgbouncer_alias: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    probes: list[str] = []
    real_probe = pooler._probe

    def counted(alias: str) -> bool:
        probes.append(alias)
        return real_probe(alias)

    monkeypatch.setattr(pooler, "_probe", counted)
    for _ in range(5):
        assert pooler.transaction_pooled(pgbouncer_alias) is True
        assert pooler.transaction_pooled("default") is False
    assert probes == [pgbouncer_alias, "default"]


def test_check_warns_for_the_queue_and_lock_aliases_behind_the_pooler(
    pgbouncer_alias: str,
) -> None:
    dbqueue = {**settings.DBQUEUE, "LOCK_DATABASE_ALIAS": pgbouncer_alias}
    with override_settings(DBQUEUE=dbqueue):
        ids = {m.id for m in run_checks(include_deployment_checks=True)}
    assert "django_dbqueue.W522" in ids, "the lock alias is behind the pooler"
    assert "django_dbqueue.W521" not in ids, "the queue's alias (default) is direct"
    direct = {m.id for m in run_checks(include_deployment_checks=True)}
    assert not direct & {"django_dbqueue.W521", "django_dbqueue.W522"}


def test_manage_py_check_deploy_through_pgbouncer_warns(
    pgbouncer: PgBouncer, worker_env: Callable[..., dict[str, str]]
) -> None:
    env = pgbouncer.env(worker_env())
    done = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output  # warnings, not errors
    assert "django_dbqueue.W521" in output, output
    assert "django_dbqueue.W522" in output, output
    assert "poll for new jobs" in output and "named_lock refuses" in output
