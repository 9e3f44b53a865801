"""run_jobs says how many connections it will open, against the server's max_connections."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from django.conf import settings as django_settings
from django.test import override_settings

from django_dbqueue.worker.connections import budget
from django_dbqueue.worker.handout import HAND_OUT_FROM, hands_out
from tests.support import CURRENT_VENDOR, Processes

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_budget_counts_the_supervisor_its_listener_each_child_and_its_threads() -> None:
    listen = CURRENT_VENDOR == "postgresql"  # one LISTEN per host, the supervisor's
    plain = budget(3, 1)
    assert plain.total == 1 + int(listen) + 3
    threaded = budget(2, 4)
    assert threaded.total == 1 + int(listen) + 2 * (1 + 4)
    assert "4 job threads" in threaded.explained
    with override_settings(DBQUEUE={**django_settings.DBQUEUE, "WAKEUP": False}):
        assert budget(3, 1).total == 4
    # From 4 children on, a server database's supervisor claims for them, on a
    # connection of its own (worker/handout.py); SQLite's children claim for themselves.
    claims = hands_out(HAND_OUT_FROM)
    assert claims is (CURRENT_VENDOR != "sqlite")
    many = budget(HAND_OUT_FROM, 1, claims)
    assert many.total == 1 + int(listen) + int(claims) + HAND_OUT_FROM
    assert ("1 claiming for the children" in many.explained) is claims
    if CURRENT_VENDOR == "sqlite":
        assert plain.server_max is None and not plain.too_many()
    else:
        assert plain.server_max is not None and plain.server_max > 10
        assert budget(plain.server_max, 1).too_many()
        assert not plain.too_many()


def test_run_jobs_prints_its_connections(
    processes: Processes, worker_env: Callable[..., dict[str, str]]
) -> None:
    proc = processes.run_jobs("--burst", "--concurrency", "2", env=worker_env())
    out, _ = proc.communicate(timeout=120)
    line = next(x for x in out.splitlines() if x.startswith("Connections to database"))
    match = re.search(r"up to (\d+) \(1 supervisor (\+ 1 LISTEN .*)?\+ 2 x (\d+)", line)
    assert match is not None, line
    assert int(match[3]) == 1
    assert int(match[1]) == (1 + 1 + 2 if CURRENT_VENDOR == "postgresql" else 1 + 2), line
    if CURRENT_VENDOR != "sqlite":
        assert "the server allows" in line
