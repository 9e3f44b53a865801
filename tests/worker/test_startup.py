"""A worker stopped while it starts exits cleanly: the supervisor before it has its signal
handlers (run_jobs' checks and task discovery), and a child before its worker has them.
Real processes, real signals."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from django_dbqueue import enqueue
from django_dbqueue.models import Job
from django_dbqueue.models import WorkerProcess as WorkerRow
from django_dbqueue.worker import children
from django_dbqueue.worker.loop import Worker
from django_dbqueue.worker.supervisor import Supervisor
from tests.support import Processes, jobs, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]


def test_run_jobs_stopped_while_it_starts_exits_0_and_starts_no_worker(
    processes: Processes, worker_env: Callable[..., dict[str, str]], tmp_path: Path
) -> None:
    job = enqueue(jobs.noop)
    starting = tmp_path / "starting"
    modules = [*settings.DBQUEUE["TASK_MODULES"], "tests.worker.slow_start"]
    env = worker_env(TASK_MODULES=modules)
    env["DBQUEUE_SLOW_START_FILE"] = str(starting)
    proc = processes.run_jobs(env=env)
    wait_until(starting.exists, timeout=120)  # discovering the task modules
    proc.send_signal(signal.SIGTERM)
    starting.unlink()
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert Job.objects.get(pk=job.pk).status == Job.Status.QUEUED, "no job was taken"
    assert not WorkerRow.objects.exists()


@pytest.fixture
def slow_child(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A child that, once forked, writes the file this yields and waits until it is
    removed before it builds its worker (the fork inherits the patch)."""
    starting = tmp_path / "child-starting"

    def make_worker(**options: Any) -> Worker:
        starting.write_text("")
        wait_until(lambda: not starting.exists(), timeout=60, interval=0.01)
        return Worker(**options)

    monkeypatch.setattr(children, "make_worker", make_worker)
    yield starting


def test_a_child_stopped_before_its_worker_has_handlers_exits_0(slow_child: Path) -> None:
    job = enqueue(jobs.noop)
    supervisor = Supervisor(1, {"queues": ["default"]})
    supervisor._spawn(0)
    child = supervisor._children[0]
    try:
        wait_until(slow_child.exists, timeout=60)  # forked, its worker not built yet
        os.kill(child.process.pid or 0, signal.SIGTERM)
        slow_child.unlink()
        child.process.join(60)
    finally:
        if child.process.is_alive():
            child.process.kill()
            child.process.join()
    assert child.process.exitcode == 0, "the stop waited for the worker's handler"
    assert Job.objects.get(pk=job.pk).status == Job.Status.QUEUED, "it took no job"
