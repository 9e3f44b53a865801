from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connection, connections

from django_dbqueue.queue import claim_statement
from tests.support import (
    CURRENT_DB,
    CURRENT_VENDOR,
    GALERA,
    REPLICA,
    SCALE,
    SECOND_DATABASE,
    Processes,
)
from tests.support.pgbouncer import ALIAS, PgBouncer, installed


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect (not skip) tests marked ``only_vendor(...)`` for another database run, and
    keep ``second_database`` tests and the others apart: only the former run (and all of
    them run) with DBQUEUE_QUEUE_DB=1, when a router moves the queue's tables away; the
    same for ``galera`` tests and DBQUEUE_TEST_GALERA=1 (they start a cluster of their own)
    and ``replica`` tests and DBQUEUE_TEST_REPLICA=1 (a primary and a replica of their own).
    ``scale`` tests run only with DBQUEUE_TEST_SCALE=1 (`nox -s scale`), with the others."""
    keep, drop = [], []
    for item in items:
        marker = item.get_closest_marker("only_vendor")
        wanted = set(marker.args) if marker is not None else set()
        right_vendor = marker is None or bool(wanted & {CURRENT_VENDOR, CURRENT_DB})
        right_run = (item.get_closest_marker("second_database") is not None) == SECOND_DATABASE
        right_run = right_run and (item.get_closest_marker("galera") is not None) == GALERA
        right_run = right_run and (item.get_closest_marker("replica") is not None) == REPLICA
        right_run = right_run and (SCALE or item.get_closest_marker("scale") is None)
        (keep if right_vendor and right_run else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A failed test's report shows the stacks of the worker processes it left running
    (a stop that timed out, say), taken before the fixture kills them."""
    report = yield
    procs = getattr(item, "funcargs", {}).get("processes")
    if report.when == "call" and report.failed and isinstance(procs, Processes):
        stacks = procs.stacks()
        if stacks:
            report.sections.append(("stacks of the processes left running", stacks))
    return report


@pytest.fixture
def vendor() -> str:
    return connection.vendor


@pytest.fixture
def worker_env(transactional_db: None) -> Callable[..., dict[str, str]]:
    """Environment for a child process that must use this test run's database."""

    def make(**dbqueue_settings: Any) -> dict[str, str]:
        env = dict(os.environ)
        env["DBQUEUE_DB"] = os.environ.get("DBQUEUE_DB", "sqlite")
        env["DBQUEUE_DB_NAME"] = str(connection.settings_dict["NAME"])
        env["DBQUEUE_SETTINGS_JSON"] = json.dumps(dbqueue_settings)
        env["PYTHONUNBUFFERED"] = "1"
        return env

    return make


@pytest.fixture
def processes() -> Iterator[Processes]:
    procs = Processes()
    yield procs
    procs.kill_all()


@pytest.fixture
def async_connections() -> Iterator[None]:
    """Close, after the test, the connections of the thread where code running under
    ``asyncio.run`` sends its blocking work (``sync_to_async``, thread-sensitive): they
    would outlive the test and keep its database from being dropped."""
    yield
    close_async_thread_connections()


def close_async_thread_connections() -> None:
    """Close the connections of the thread where ``sync_to_async`` (thread-sensitive)
    sends blocking work from code run under ``asyncio.run``."""
    asyncio.run(sync_to_async(connections.close_all, thread_sensitive=True)())


@pytest.fixture(autouse=True)
def claims_start_afresh() -> Iterator[None]:
    """A queue whose claims met only keyed rows skips PostgreSQL's one-statement claim for
    a while, per process (queue/claim_statement.py): not into the next test."""
    yield
    claim_statement.forget()


@pytest.fixture(scope="session", autouse=True)
def no_connection_outlives_the_run(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """Before the test database is dropped: close the connections of the thread where
    ``sync_to_async`` sends blocking work, then end (with a line naming them and this
    process's live threads) any other session a test left on PostgreSQL's test
    database, which would make its DROP DATABASE fail ("being accessed by other users")
    and fail the last test of the run after it passed."""
    yield
    close_async_thread_connections()
    with django_db_blocker.unblock():
        for alias in connections:
            conn = connections[alias]
            if conn.vendor != "postgresql":
                continue
            with conn.cursor() as cursor:
                cursor.execute(
                    "SELECT pid, state, left(query, 120) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
                left = cursor.fetchall()
                for pid, _state, _query in left:
                    cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
            if left:
                threads = sorted(t.name for t in threading.enumerate())
                LEFT_OVER.append(
                    f"{len(left)} connection(s) to {conn.settings_dict['NAME']!r} outlived "
                    f"the tests (ended now): {left}; live threads: {threads}"
                )


LEFT_OVER: list[str] = []  # no_connection_outlives_the_run's findings, for the summary


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for line in LEFT_OVER:
        terminalreporter.write_line(f"WARNING: {line}", yellow=True)


@pytest.fixture(scope="session")
def pgbouncer(django_db_setup: None, django_db_blocker: Any) -> Iterator[PgBouncer]:
    """The suite's own PgBouncer (transaction pooling) in front of this run's PostgreSQL:
    started once, stopped before the test database is dropped (it depends on
    django_db_setup, so it is torn down first). Missing pgbouncer: a failure under
    CI=true, a skip otherwise."""
    if installed() is None:
        message = "pgbouncer is not installed (apt-get install pgbouncer)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    params = connections["default"].settings_dict
    server = PgBouncer(params["USER"], params["HOST"] or "127.0.0.1", params["PORT"] or "5432")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pgbouncer_alias(transactional_db: None, pgbouncer: PgBouncer) -> Iterator[str]:
    """The Django alias ``pgbouncer``: this run's test database through :func:`pgbouncer`."""
    from django_dbqueue.queue.dialects import pooler

    direct = connections["default"].settings_dict
    connections.settings[ALIAS] = {
        **direct,
        "PORT": str(pgbouncer.port),
        "DISABLE_SERVER_SIDE_CURSORS": True,
        # PgBouncer 1.18 in transaction mode keeps no prepared statement.
        "OPTIONS": {k: v for k, v in direct["OPTIONS"].items() if k != "prepare_threshold"},
    }
    pooler.forget()
    try:
        yield ALIAS
    finally:
        if ALIAS in connections.settings:
            connections[ALIAS].close()
            del connections[ALIAS]
            del connections.settings[ALIAS]
        pooler.forget()
