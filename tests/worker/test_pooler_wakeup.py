"""run_jobs through PgBouncer in transaction mode: LISTEN would hear nothing, so the
workers poll, with one warning saying why (not one per child, nor per retry), and every
job still runs."""

from __future__ import annotations

import signal
from collections.abc import Callable

import pytest

from django_dbqueue import enqueue
from django_dbqueue.models import Job
from tests.support import Processes, jobs, wait_until
from tests.support.pgbouncer import PgBouncer

pytestmark = [
    pytest.mark.only_vendor("postgresql"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.processes,
]

WARNING = "goes through a pooler in transaction mode"


def run_and_stop(processes: Processes, env: dict[str, str], *args: str) -> tuple[str, list[int]]:
    """A worker that runs 20 jobs enqueued while it waits, twice (it is idle between:
    the wake-up, or the poll, must bring it back); its output once stopped."""
    proc = processes.run_jobs("--concurrency", "2", *args, env=env)
    done = []
    for _ in range(2):
        ids = [enqueue(jobs.noop).id for _ in range(20)]
        wait_until(
            lambda ids=ids: Job.objects.filter(id__in=ids, status=Job.Status.DONE).count() == 20,
            timeout=120,
        )
        done.extend(ids)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    return out, done


def test_workers_behind_pgbouncer_poll_with_one_warning_and_run_every_job(
    pgbouncer: PgBouncer, worker_env: Callable[..., dict[str, str]], processes: Processes
) -> None:
    env = pgbouncer.env(worker_env(POLL_INTERVAL=0.5))
    out, done = run_and_stop(processes, env)
    assert Job.objects.filter(id__in=done, status=Job.Status.DONE).count() == 40
    assert out.count(WARNING) == 1, out
    assert "polling instead" not in out, "no LISTEN was tried and failed"
    # No LISTEN connection in the budget it printed: 1 supervisor + 2 x 1.
    assert "up to 3 (1 supervisor + 2 x 1: worker)" in out, out


def test_direct_workers_still_listen(
    worker_env: Callable[..., dict[str, str]], processes: Processes
) -> None:
    out, done = run_and_stop(processes, worker_env(POLL_INTERVAL=0.5))
    assert Job.objects.filter(id__in=done, status=Job.Status.DONE).count() == 40
    assert WARNING not in out
    assert "up to 4 (1 supervisor + 1 LISTEN (relayed to the children) + 2 x 1: worker)" in out, out
