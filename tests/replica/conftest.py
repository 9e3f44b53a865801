"""The replica suite's servers: a MariaDB primary and its replica (tests/support/replica.py),
started once for the session, before pytest-django creates the test database on the
primary (it reaches the replica as every write does), stopped and removed at the end.
Its tests run only with DBQUEUE_TEST_REPLICA=1 (the MariaDB full run does so): the
servers' ports are fixed, so two runs at once cannot both have them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support.replica import ReplicaPair, running_pair


@pytest.fixture(scope="session")
def replica_servers() -> Iterator[ReplicaPair]:
    with running_pair() as pair:
        yield pair


@pytest.fixture(scope="session")
def django_db_modify_db_settings(
    django_db_modify_db_settings_parallel_suffix: None, replica_servers: ReplicaPair
) -> None:
    """pytest-django's hook before it creates the test database: the servers run by then."""


@pytest.fixture
def pair(replica_servers: ReplicaPair, transactional_db: None) -> Iterator[ReplicaPair]:
    """The pair, the replica applying and caught up at the start and at the end of the test."""
    replica_servers.catch_up()
    yield replica_servers
    replica_servers.catch_up()


@pytest.fixture
def replica_env(worker_env: Callable[..., dict[str, str]]) -> Callable[..., dict[str, str]]:
    """The environment of a process whose router reads every model, the queue's too,
    from the replica (writes go to the primary). SAFE_READ_ALIASES names it so the
    process passes `check` (E007): the queue must be right even when a project says so."""

    def make(safe: bool = True, **dbqueue_settings: Any) -> dict[str, str]:
        if safe:
            dbqueue_settings.setdefault("SAFE_READ_ALIASES", ["replica"])
        env = worker_env(**dbqueue_settings)
        env["DBQUEUE_READ_REPLICA"] = "1"
        return env

    return make
