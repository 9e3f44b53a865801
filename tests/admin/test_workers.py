"""The worker list and the dashboard show each supervisor, its children and their jobs."""

from __future__ import annotations

import signal
from collections.abc import Callable

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from django_dbqueue import enqueue
from django_dbqueue.models import Job, WorkerProcess
from tests.support import Processes, jobs, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]


@pytest.fixture
def operator() -> Client:
    user = User.objects.create_user("operator", password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(codename__in=["view_job", "view_workerprocess"])
    )
    client = Client()
    client.force_login(user)
    return client


def test_admin_shows_the_supervisor_its_children_and_the_running_job(
    operator: Client, processes: Processes, worker_env: Callable[..., dict[str, str]]
) -> None:
    job = enqueue(jobs.sleep, [30])
    proc = processes.run_jobs(
        "--concurrency", "2", env=worker_env(HEARTBEAT_INTERVAL=0.3, LEASE_TIMEOUT=10)
    )
    wait_until(lambda: WorkerProcess.objects.filter(running_job_id=job.pk).exists(), timeout=30)
    supervisor = WorkerProcess.objects.get(role=WorkerProcess.Role.SUPERVISOR)
    kids = list(WorkerProcess.objects.filter(role=WorkerProcess.Role.CHILD).order_by("pid"))
    assert supervisor.pid == proc.pid
    assert len(kids) == 2 and {kid.supervisor for kid in kids} == {supervisor.name}
    runner = WorkerProcess.objects.get(running_job_id=job.pk)
    assert runner.running_since is not None
    assert Job.objects.get(pk=job.pk).owner == runner.name

    page = operator.get(reverse("admin:django_dbqueue_workerprocess_changelist")).content.decode()
    job_link = reverse("admin:django_dbqueue_job_change", args=[job.pk])
    assert f'<a href="{job_link}">#{job.pk}</a>' in page
    for row in [supervisor, *kids]:
        assert row.name in page
    assert page.count('<td class="field-role">Supervisor</td>') == 1
    assert page.count('<td class="field-role">Child</td>') == 2

    response = operator.get(reverse("admin:django_dbqueue_job_dashboard"))
    rows = [row.worker.name for row in response.context["workers"]]
    assert rows == [supervisor.name, *(kid.name for kid in kids)], "children follow their parent"
    dashboard = response.content.decode()
    assert f'href="{job_link}">#{job.pk}</a> for' in dashboard
    assert dashboard.count('class="dbq-worker-child"') == 2
    assert dashboard.count('class="dbq-worker-supervisor"') == 1

    proc.send_signal(signal.SIGTERM)
    # Shown at once; the idle child exits and its row goes, the busy one's stays.
    stopping = WorkerProcess.objects.filter(stopping=True, name__in=[supervisor.name, runner.name])
    wait_until(lambda: stopping.count() == 2, timeout=10)
    proc.send_signal(signal.SIGTERM)  # the sleeping job is stopped, recorded and retried
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert not WorkerProcess.objects.exists()
