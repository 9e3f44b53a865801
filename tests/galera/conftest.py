"""The Galera suite's cluster: started once for the session (about 30 s), stopped at the
end. Its tests run only with ``-m galera`` and DBQUEUE_TEST_GALERA=1 (``nox -s galera``):
the cluster's ports are fixed, so two runs at once cannot both have one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.galera import GaleraCluster, running_cluster


@pytest.fixture(scope="session")
def galera() -> Iterator[GaleraCluster]:
    with running_cluster() as cluster:
        yield cluster


@pytest.fixture
def cluster(galera: GaleraCluster) -> Iterator[GaleraCluster]:
    """The cluster, its queue and lock tables empty at the start of the test."""
    galera.truncate("dbqueue_job", "dbqueue_lock", "dbqueue_counter", "dbqueue_worker")
    yield galera
