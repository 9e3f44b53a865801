"""The smoke suite: the app's main path end to end, quick enough for every Python x Django
cell (`pytest -m smoke`; the full runs include it too).

Checks, migrations both ways, a job enqueued in a transaction and run by a real
`run_jobs --burst`, the admin's job list and dashboard, and a Django Tasks `@task`
enqueued through TASKS and read back.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_dbqueue import enqueue
from django_dbqueue.models import Job
from tests.support import Processes, jobs

pytestmark = pytest.mark.smoke


@pytest.mark.django_db
def test_system_checks_pass() -> None:
    call_command("check", fail_level="WARNING", verbosity=0)


@pytest.mark.django_db
def test_models_and_migrations_agree() -> None:
    # Exits non-zero when this Django version would write a new migration for the app.
    call_command("makemigrations", "django_dbqueue", check=True, dry_run=True, verbosity=0)


@pytest.mark.django_db(transaction=True)
def test_migrations_unapply_and_apply_again() -> None:
    table = Job._meta.db_table
    call_command("migrate", "django_dbqueue", "zero", verbosity=0)
    assert table not in connection.introspection.table_names()
    call_command("migrate", "django_dbqueue", verbosity=0)
    assert table in connection.introspection.table_names()
    executor = MigrationExecutor(connection)
    assert executor.migration_plan(executor.loader.graph.leaf_nodes()) == []
    Job.objects.create(task="tests.support.jobs.add")


@pytest.mark.processes
def test_job_enqueued_in_a_transaction_is_run_by_a_burst_worker(
    processes: Processes, worker_env: Callable[..., dict[str, str]]
) -> None:
    with transaction.atomic():
        job = enqueue(jobs.add, args=[2, 3])
    with pytest.raises(RuntimeError), transaction.atomic():
        enqueue(jobs.add, args=[4, 5])
        raise RuntimeError("rolled back: the job goes with it")
    assert list(Job.objects.values_list("args", flat=True)) == [[2, 3]]

    proc = processes.run_jobs("--burst", env=worker_env())
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert "Finished: 1 done, 0 failed" in out

    job.refresh_from_db()
    assert (job.status, job.result, job.attempts) == (Job.Status.DONE, 5, 1)


@pytest.mark.django_db
def test_admin_job_list_and_dashboard(admin_client: Client) -> None:
    enqueue(jobs.add, args=[1, 1])
    failed = Job.objects.create(
        task="tests.support.jobs.fail",
        status=Job.Status.FAILED,
        last_error="ValueError: smoke",
        finished_at=timezone.now(),  # as every finished job has
    )

    page = admin_client.get(reverse("admin:django_dbqueue_job_changelist"))
    assert page.status_code == 200
    assert b"tests.support.jobs.add" in page.content and b"tests.support.jobs.fail" in page.content

    dashboard = admin_client.get(reverse("admin:django_dbqueue_job_dashboard"))
    assert dashboard.status_code == 200
    assert b"ValueError: smoke" in dashboard.content

    detail = admin_client.get(reverse("admin:django_dbqueue_job_change", args=[failed.pk]))
    assert detail.status_code == 200


@pytest.mark.processes
def test_task_enqueued_through_tasks_runs_and_is_read_back(
    processes: Processes, worker_env: Callable[..., dict[str, str]]
) -> None:
    from django_dbqueue.tasks.compat import TaskResultStatus, task_backends
    from tests.support import task_functions

    assert type(task_backends["default"]).__name__ == "DBQueueBackend"
    result = task_functions.add.enqueue(20, 22)
    assert result.status == TaskResultStatus.READY

    proc = processes.run_jobs("--burst", env=worker_env())
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out

    fetched = task_functions.add.get_result(result.id)
    assert (fetched.status, fetched.return_value) == (TaskResultStatus.SUCCESSFUL, 42)
