"""``run_jobs`` with every claim counted, for the claim-stream tests and measurements.

Run as ``python -m tests.support.counted_claims LOG [run_jobs arguments ...]``. Every
claim a child makes appends one line to LOG: ``<statements> <jobs> <transactions>
<empty> <pid>``: the statements the claim sent (from Django's query log of the
connection), the jobs it took, its claim transactions (PostgreSQL's claim statement is
one), how many of those locked nothing and the process that claimed. Children are
forked from this process, so they inherit the wrapping, and the round-trip delay of
``DBQUEUE_TEST_DELAY_MS`` (tests/support/latency.py) when it is set.
``DBQUEUE_TEST_NO_HANDOUT=1`` has the children claim for themselves, not the supervisor
for them (worker/handout.py), to measure what the hand-out costs or saves. The
supervisor's claims are counted in its claimer thread, like a child's.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connections  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402

from django_dbqueue.queue import claim  # noqa: E402
from django_dbqueue.worker import handout  # noqa: E402
from tests.support import latency  # noqa: E402


def count_claims(log: str) -> None:
    """Wrap the claim so that each one writes its line to ``log``."""
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    take, claim_jobs = claim._take, claim.claim
    takes: list[int] = []

    def counted_take(*args: Any, **kwargs: Any) -> tuple[int, list[Any]]:
        locked, jobs = take(*args, **kwargs)
        takes.append(locked)
        return locked, jobs

    def counted_claim(model: Any, using: str, *args: Any) -> claim.Claimed:
        takes.clear()
        with CaptureQueriesContext(connections[using]) as queries:
            jobs = claim_jobs(model, using, *args)
        empty = sum(1 for locked in takes if not locked)
        line = f"{len(queries)} {len(jobs)} {len(takes)} {empty} {os.getpid()}\n"
        os.write(fd, line.encode())
        return jobs

    unkeyed = claim.claim_unkeyed

    def counted_unkeyed(*args: Any, **kwargs: Any) -> tuple[list[Any], int]:
        jobs, locked = unkeyed(*args, **kwargs)  # one statement: a transaction of its own
        takes.append(locked)
        return jobs, locked

    claim._take = counted_take  # type: ignore[assignment]
    claim.claim_unkeyed = counted_unkeyed  # type: ignore[assignment]
    claim.claim = counted_claim  # type: ignore[assignment]


def start(processes: Any, log: str, *run_jobs_args: str, env: dict[str, str]) -> Any:
    """A ``run_jobs`` process (``processes``: the tests' :class:`~tests.support.Processes`)
    whose claims go to ``log``."""
    return processes.python("-m", "tests.support.counted_claims", log, *run_jobs_args, env=env)


Claim = tuple[int, int, int, int, int]


def read(log: str) -> list[Claim]:
    """The lines of ``log``: (statements, jobs, transactions, empty transactions, the
    claiming process's pid) per claim."""
    if not os.path.exists(log):
        return []
    with open(log) as lines:
        return [tuple(int(n) for n in line.split()) for line in lines]  # type: ignore[misc]


if __name__ == "__main__":
    count_claims(sys.argv[1])
    if os.environ.get(latency.VARIABLE):
        latency.install()
    if os.environ.get("DBQUEUE_TEST_NO_HANDOUT") == "1":
        handout.HAND_OUT_FROM = sys.maxsize  # type: ignore[misc]
    call_command("run_jobs", *sys.argv[2:])
