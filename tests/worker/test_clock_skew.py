"""Hosts whose clocks are wrong by 90 s (libfaketime on real worker processes): the
database's clock decides leases, recovery, run_after, defaults and ticks.

SQLite has no server clock: its one host's clock is the only one, so these tests run on
MariaDB/MySQL and PostgreSQL.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.db import router

from django_dbqueue import enqueue, enqueue_many
from django_dbqueue.models import Job, ScheduleTick, WorkerProcess
from django_dbqueue.queue import clock
from tests.support import ROOT, Processes, jobs, wait_until

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.processes,
    pytest.mark.only_vendor("mysql", "postgres"),  # SQLite: one host, one clock
]

FAST, SLOW, RIGHT = "+90s", "-90s", "+0s"
SETTINGS = {"LEASE_TIMEOUT": 10, "HEARTBEAT_INTERVAL": 0.5, "POLL_INTERVAL": 0.5, "RETRY_JITTER": 0}


def skewed(env: dict[str, str], offset: str) -> dict[str, str]:
    """``env`` for a process whose clock is ``offset`` off (libfaketime preloaded). Its
    monotonic clock is left alone (libfaketime's makes timed waits wait the skew too),
    and time.sleep() goes through select() (tests/support/faketime/sitecustomize.py)."""
    library = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
    assert shutil.which("faketime") and os.path.exists(library), "apt install faketime"
    path = [str(ROOT / "tests" / "support" / "faketime"), env.get("PYTHONPATH", "")]
    return {
        **env,
        "PYTHONPATH": os.pathsep.join(p for p in path if p),
        "LD_PRELOAD": library,
        "FAKETIME": offset,
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_NO_CACHE": "1",
    }


def db_now() -> datetime:
    return clock.now(router.db_for_write(Job), fresh=True)


def supervisor_row(pid: int) -> WorkerProcess | None:
    return WorkerProcess.objects.filter(pid=pid, role=WorkerProcess.Role.SUPERVISOR).first()


def beats_after(pid: int, count: int) -> None:
    """Wait until the supervisor ``pid`` has beaten ``count`` more times (each beat runs
    its lease recovery)."""
    for _ in range(count):
        row = wait_until(lambda: supervisor_row(pid), timeout=90)
        wait_until(
            lambda last=row.heartbeat_at: supervisor_row(pid).heartbeat_at > last, timeout=90
        )


def stop(*procs: subprocess.Popen[str]) -> None:
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        proc.wait(timeout=60)


@pytest.mark.parametrize(
    ("live", "other"), [(RIGHT, FAST), (SLOW, RIGHT)], ids=["fast-other", "slow-live"]
)
def test_no_job_is_recovered_from_a_live_host(
    processes: Processes,
    worker_env: Callable[..., dict[str, str]],
    tmp_path: Path,
    live: str,
    other: str,
) -> None:
    gate = tmp_path / "gate"
    env = worker_env(**SETTINGS)
    holder = processes.run_jobs("--concurrency", "2", env=skewed(env, live))
    held = enqueue_many(
        {"task": jobs.hold_until, "args": [str(gate), f"k{i}", 600]} for i in range(2)
    )
    claimed = Job.objects.filter(pk__in=[j.pk for j in held], status=Job.Status.CLAIMED)
    wait_until(lambda: claimed.count() == 2, timeout=90)
    other_host = processes.run_jobs("--concurrency", "1", env=skewed(env, other))
    # Each beat of the other host's supervisor runs lease recovery: by the host's clock
    # the live host's leases are 90 s old.
    beats_after(other_host.pid, 3)
    # Each host's offset from the database's clock is in its heartbeat row.
    offsets = dict(
        WorkerProcess.objects.filter(role=WorkerProcess.Role.SUPERVISOR).values_list(
            "pid", "clock_offset"
        )
    )
    skew = {holder.pid: live, other_host.pid: other}
    for pid, offset in skew.items():
        expected = -float(offset.rstrip("s"))
        assert offsets[pid] is not None
        assert expected - 3 < offsets[pid] < expected + 3
    assert claimed.count() == 2
    gate.write_text("open")
    wait_until(lambda: Job.objects.filter(status=Job.Status.DONE).count() == 2, timeout=90)
    stop(holder, other_host)
    for job in Job.objects.all():
        assert (job.attempts, job.last_error, job.status) == (1, "", Job.Status.DONE)


def test_a_fast_host_runs_no_job_before_its_run_after(
    processes: Processes, worker_env: Callable[..., dict[str, str]]
) -> None:
    env = skewed(worker_env(**SETTINGS), FAST)
    worker = processes.run_jobs("--concurrency", "1", env=env)
    wait_until(lambda: supervisor_row(worker.pid), timeout=90)
    delayed = [enqueue(jobs.database_time, run_after=timedelta(seconds=4)) for _ in range(3)]
    retried = enqueue(jobs.fail, max_attempts=2, retry_backoff=4)
    done = Job.objects.filter(pk__in=[j.pk for j in delayed], status=Job.Status.DONE)
    wait_until(lambda: done.count() == 3, timeout=90)
    failed = Job.objects.filter(pk=retried.pk, status=Job.Status.FAILED)
    wait_until(failed.exists, timeout=90)
    stop(worker)
    for job in done:
        assert datetime.fromisoformat(job.result) >= job.run_after
    # The retry's backoff (4 s) was counted on the database's clock too.
    errors = Job.objects.get(pk=retried.pk).errors
    first, second = (datetime.fromisoformat(e["at"]) for e in errors)
    assert second - first >= timedelta(seconds=4)


def test_a_job_enqueued_by_a_fast_web_process_is_not_delayed(
    worker_env: Callable[..., dict[str, str]],
) -> None:
    env = skewed(worker_env(), FAST)
    code = (
        "from django_dbqueue import enqueue; from tests.support import jobs; "
        "print(enqueue(jobs.noop).pk)"
    )
    out = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    job = Job.objects.get(pk=int(out.stdout.strip().splitlines()[-1]))
    # Runnable now by the database's clock (by the web host's it would wait 90 s).
    assert job.run_after <= db_now()
    assert Job.objects.runnable().filter(pk=job.pk).exists()


def test_ticks_of_a_fast_and_a_normal_host_are_each_enqueued_once_and_never_early(
    processes: Processes, worker_env: Callable[..., dict[str, str]]
) -> None:
    env = worker_env(SCHEDULE={"tick": {"task": "tests.support.jobs.noop", "every": 1}})
    normal = processes.run_jobs("-v", "0", env=env)
    fast = processes.run_jobs("-v", "0", env=skewed(env, FAST))
    wait_until(lambda: ScheduleTick.objects.count() >= 6, timeout=90)
    stop(fast)  # the other host goes on alone: no gap
    wait_until(lambda: ScheduleTick.objects.count() >= 12, timeout=90)
    stop(normal)
    end = db_now()
    ticks = list(ScheduleTick.objects.order_by("tick_at").values_list("tick_at", flat=True))
    seconds = [int(t.timestamp()) for t in ticks]
    assert seconds == list(range(seconds[0], seconds[0] + len(seconds)))
    assert ticks[-1] <= end
    job_ids = list(ScheduleTick.objects.values_list("job_id", flat=True))
    assert None not in job_ids and len(set(job_ids)) == len(job_ids)
