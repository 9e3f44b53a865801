"""``dbqueue_health``: exit 0 when this host's supervisor beats and the database answers,
1 with one line per problem otherwise; --ready, --max-lag, --json."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from django_dbqueue import enqueue
from django_dbqueue.models import Job, WorkerProcess
from tests.support import ROOT, Processes, empty_database, jobs, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def health(*args: str) -> tuple[int, str, str]:
    out, err = StringIO(), StringIO()
    try:
        call_command("dbqueue_health", *args, stdout=out, stderr=err)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def supervisor(age: float, host: str | None = None) -> WorkerProcess:
    return WorkerProcess.objects.create(
        name=f"{host or socket.gethostname()}:1:abc{age:g}",
        host=host or socket.gethostname(),
        pid=1,
        role=WorkerProcess.Role.SUPERVISOR,
        heartbeat_at=timezone.now() - timedelta(seconds=age),
    )


def test_no_supervisor_on_this_host_is_a_problem() -> None:
    supervisor(0, host="another-host")  # another host's supervisor does not count
    code, out, err = health()
    assert (code, out) == (1, "")
    assert err.splitlines() == [
        f"No run_jobs supervisor is registered on host {socket.gethostname()!r}."
    ]


def test_a_fresh_supervisor_is_healthy_and_a_stale_one_is_not() -> None:
    row = supervisor(2)
    assert health() == (0, "OK\n", "")
    WorkerProcess.objects.filter(pk=row.pk).update(
        heartbeat_at=timezone.now() - timedelta(seconds=300)
    )
    code, _, err = health()
    assert code == 1
    assert "last beat 300 s ago (over 30 s)" in err
    assert health("--max-heartbeat-age", "600")[0] == 0


def test_lag_over_the_limit_names_the_queue() -> None:
    supervisor(0)
    job = enqueue(jobs.add, args=[1, 2])
    Job.objects.filter(pk=job.pk).update(run_after=timezone.now() - timedelta(seconds=120))
    code, _, err = health("--max-lag", "60")
    assert code == 1
    assert err.splitlines() == [
        f"Queue 'default': its oldest due job ({job.pk}) has waited 120 s (over 60 s)."
    ]
    assert health("--max-lag", "600")[0] == 0


def test_json_report() -> None:
    code, out, _ = health("--json", "--max-lag", "60")
    report = json.loads(out)
    assert code == 1
    assert report["ok"] is False
    assert report["mode"] == "live"
    assert report["supervisor_heartbeat_age"] is None
    assert len(report["problems"]) == 1
    assert set(report["lag_seconds"]) >= {"default"}


def test_ready_needs_no_supervisor_but_a_migrated_database() -> None:
    assert health("--ready") == (0, "OK\n", "")


def command_in(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "dbqueue_health", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_ready_fails_on_an_unmigrated_database(
    worker_env: Callable[..., dict[str, str]], tmp_path: Path
) -> None:
    with empty_database(connection, tmp_path / "empty.sqlite3") as name:
        env = {**worker_env(), "DBQUEUE_DB_NAME": name}
        proc = command_in(env, "--ready")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    [line] = proc.stderr.splitlines()
    assert "run `python manage.py migrate` first" in line


@pytest.mark.only_vendor("mysql", "postgresql")
def test_a_database_that_does_not_answer_is_one_line(
    worker_env: Callable[..., dict[str, str]],
) -> None:
    env = {**worker_env(), "DBQUEUE_DB_NAME": "test_dbq_observe_no_such_database"}
    proc = command_in(env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith("Database 'default' does not answer: ")


@pytest.mark.processes
def test_a_running_supervisor_is_healthy_until_it_stops(
    processes: Processes, worker_env: Callable[..., dict[str, str]]
) -> None:
    env = worker_env()
    worker = processes.run_jobs("--concurrency", "1", env=env)
    wait_until(
        lambda: WorkerProcess.objects.filter(role=WorkerProcess.Role.SUPERVISOR).exists(),
        timeout=60,
    )
    alive = command_in(env)
    assert alive.returncode == 0, alive.stdout + alive.stderr
    worker.terminate()
    out, _ = worker.communicate(timeout=60)
    assert worker.returncode == 0, out
    gone = command_in(env)
    assert gone.returncode == 1
    assert "No run_jobs supervisor is registered" in gone.stderr
    assert os.environ.get("PROMETHEUS_MULTIPROC_DIR") is None
