"""``dbqueue_health`` adds up the connections the live workers of every host may open and
warns above 80% of the server's max_connections (without failing the probe)."""

from __future__ import annotations

import json
import math
import socket
from datetime import timedelta

import pytest
from django.utils import timezone

from django_dbqueue.models import WorkerProcess
from django_dbqueue.worker.connections import listens, server_max_connections
from django_dbqueue.worker.handout import hands_out
from tests.observability.test_health import health

pytestmark = pytest.mark.django_db(transaction=True)
HERE = socket.gethostname()


def host_rows(host: str, children: int, age: float = 0.0) -> int:
    """A supervisor and its ``children`` on ``host``, last beating ``age`` s ago; the
    connections run_jobs budgets for them."""
    beat = timezone.now() - timedelta(seconds=age)
    supervisor = f"{host}:1:sup"
    rows = [
        WorkerProcess(
            name=supervisor, host=host, pid=1, role=WorkerProcess.Role.SUPERVISOR, heartbeat_at=beat
        )
    ]
    rows += [
        WorkerProcess(
            name=f"{host}:{i + 2}:child",
            host=host,
            pid=i + 2,
            role=WorkerProcess.Role.CHILD,
            supervisor=supervisor,
            heartbeat_at=beat,
        )
        for i in range(children)
    ]
    WorkerProcess.objects.bulk_create(rows)
    # The supervisor's own, on PostgreSQL the host's one LISTEN, and its claimer's for
    # 4 children or more (worker/handout.py); a child its own.
    return 1 + int(listens("default")) + int(hands_out(children)) + children


@pytest.mark.only_vendor("mysql", "postgresql")
def test_hosts_over_80_percent_of_max_connections_warn_and_stay_healthy() -> None:
    server_max = server_max_connections("default")
    assert server_max is not None
    # Three hosts that together pass 80%, none of them alone.
    children = math.ceil(0.8 * server_max / 3)
    expected = {name: host_rows(name, children) for name in (HERE, "web-2", "web-3")}
    total = sum(expected.values())
    assert total > 0.8 * server_max and max(expected.values()) < 0.8 * server_max
    code, out, err = health()
    assert (code, out) == (0, "OK\n"), err
    [warning] = err.splitlines()
    assert warning.startswith("Warning: The workers of 3 host(s) may open")
    assert f"{total} connections" in warning and f"max_connections ({server_max})" in warning
    for name, count in expected.items():
        assert f"{name} {count}" in warning
    report = json.loads(health("--json")[1])
    assert report["ok"] is True
    assert report["connections"] == {
        "workers": total,
        "hosts": expected,
        "max_connections": server_max,
    }
    assert len(report["warnings"]) == 1


@pytest.mark.only_vendor("mysql", "postgresql")
def test_dead_hosts_do_not_count() -> None:
    server_max = server_max_connections("default")
    assert server_max is not None
    children = math.ceil(0.8 * server_max / 3)
    live = host_rows(HERE, children)
    for name in ("gone-1", "gone-2"):
        host_rows(name, children, age=3600)  # stopped beating an hour ago
    code, out, err = health()
    assert (code, out, err) == (0, "OK\n", "")
    report = json.loads(health("--json")[1])
    assert report["connections"]["workers"] == live
    assert set(report["connections"]["hosts"]) == {HERE}
    assert report["warnings"] == []


@pytest.mark.only_vendor("sqlite")
def test_sqlite_has_no_max_connections() -> None:
    host_rows(HERE, 2)
    report = json.loads(health("--json")[1])
    assert report["ok"] is True and report["warnings"] == []
    assert "connections" not in report
