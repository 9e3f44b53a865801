"""The queue in a database of its own (docs/databases.md): a router sends django_dbqueue's
models to the alias "queue". Runs alone, with DBQUEUE_QUEUE_DB=1:

    DBQUEUE_QUEUE_DB=1 DBQUEUE_DB=mysql python -m pytest tests/test_second_database.py
"""

from __future__ import annotations

import io
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.apps import apps
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connections, router, transaction
from django.test import Client, override_settings
from django.urls import reverse

from django_dbqueue import enqueue, enqueue_many
from django_dbqueue.checks import check_lock_settings
from django_dbqueue.exceptions import CrossDatabaseEnqueue, CrossDatabaseEnqueueWarning
from django_dbqueue.locks import named_lock, next_counter_value
from django_dbqueue.models import Counter, Job, QueueState, WorkerProcess
from django_dbqueue.worker import wakeup
from django_dbqueue.worker.loop import Worker
from testproject.models import Execution
from tests.support import (
    CURRENT_VENDOR,
    Processes,
    empty_database,
    jobs,
    task_functions,
    wait_until,
)

pytestmark = [
    pytest.mark.second_database,
    pytest.mark.django_db(transaction=True, databases=["default", "queue"]),
]
QUEUE_MODELS = list(apps.get_app_config("django_dbqueue").get_models())
QUEUE_TABLES = {model._meta.db_table for model in QUEUE_MODELS}
APP_TABLES = {"auth_user", "django_admin_log", "django_session", "testproject_execution"}
# PostgreSQL wakes workers through LISTEN/NOTIFY; the others through Redis when configured.
WAKE = {} if CURRENT_VENDOR == "postgresql" else {"WAKEUP_REDIS_ALIAS": "redis"}


def tables(alias: str) -> set[str]:
    return set(connections[alias].introspection.table_names())


def job_ids_in(alias: str) -> list[int]:
    """Read the table with plain SQL on one alias: no router involved."""
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT id FROM dbqueue_job ORDER BY id")
        return [row[0] for row in cursor.fetchall()]


def in_another_thread(read: Callable[[], Any]) -> Any:
    """``read()`` on connections of its own, as another process would see the data."""
    result: list[Any] = []

    def target() -> None:
        try:
            result.append(read())
        finally:
            connections.close_all()

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(30)
    return result[0]


def dbqueue(**options: Any) -> override_settings:
    return override_settings(DBQUEUE={**settings.DBQUEUE, **options})


@pytest.fixture
def queue_env(worker_env: Callable[..., dict[str, str]]) -> Callable[..., dict[str, str]]:
    """Environment for a child process that uses both test databases."""

    def make(**dbqueue_settings: Any) -> dict[str, str]:
        env = worker_env(**dbqueue_settings)
        env["DBQUEUE_QUEUE_DB"] = "1"
        env["DBQUEUE_QUEUE_DB_NAME"] = str(connections["queue"].settings_dict["NAME"])
        return env

    return make


# -- where the tables and rows are ---------------------------------------------------


def test_the_router_sends_the_queue_models_to_the_queue_database() -> None:
    assert {Job, WorkerProcess, Counter} <= set(QUEUE_MODELS)
    for model in QUEUE_MODELS:
        assert router.db_for_write(model) == "queue"
        assert router.db_for_read(model) == "queue"
    assert router.db_for_write(Execution) == "default"


def test_migrate_put_the_queue_tables_only_in_the_queue_database() -> None:
    assert QUEUE_TABLES <= tables("queue")
    assert not QUEUE_TABLES & tables("default")
    assert APP_TABLES <= tables("default")
    assert not APP_TABLES & tables("queue")


def test_enqueue_writes_to_the_queue_database() -> None:
    job = enqueue(jobs.add, args=[1, 2])
    many = enqueue_many([{"task": jobs.add, "args": [i, i]} for i in range(3)])
    assert job._state.db == "queue"
    assert job_ids_in("queue") == [job.pk, *(j.pk for j in many)]


def test_django_tasks_enqueue_and_read_back_through_the_queue_database() -> None:
    result = task_functions.add.enqueue(2, 3)
    assert job_ids_in("queue") == [int(result.id)]
    assert task_functions.add.get_result(result.id).args == [2, 3]


# -- what it costs: enqueue is not in the app's transaction ---------------------------


def test_a_rollback_on_default_does_not_undo_the_job() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        Execution.objects.create(key="order", pid=0)
        with pytest.warns(CrossDatabaseEnqueueWarning, match="stays if that transaction"):
            job = enqueue(jobs.add, args=[1, 2])
        raise RuntimeError("the app's transaction rolls back")
    assert not Execution.objects.exists(), "the app's row is gone"
    assert job_ids_in("queue") == [job.pk], "the job is not"


def test_a_job_enqueued_in_a_transaction_on_default_is_visible_before_it_commits() -> None:
    with transaction.atomic(), pytest.warns(CrossDatabaseEnqueueWarning):
        job = enqueue(jobs.add, args=[1, 2])
        seen = in_another_thread(lambda: Job.objects.filter(pk=job.pk).exists())
        assert seen, "a worker can claim the job before the app's transaction commits"


def test_enqueue_in_another_databases_transaction_can_be_refused() -> None:
    with override_settings(DBQUEUE={**settings.DBQUEUE, "CROSS_DATABASE_ENQUEUE": "raise"}):
        with pytest.raises(CrossDatabaseEnqueue), transaction.atomic():
            enqueue(jobs.add, args=[1, 2])
        with pytest.raises(CrossDatabaseEnqueue), transaction.atomic():
            enqueue_many([{"task": jobs.add, "args": [3, 4]}])
    assert job_ids_in("queue") == [], "nothing written"
    with override_settings(DBQUEUE={**settings.DBQUEUE, "CROSS_DATABASE_ENQUEUE": "ignore"}):
        with transaction.atomic():
            enqueue(jobs.add, args=[1, 2])
    assert len(job_ids_in("queue")) == 1


def test_atomic_on_the_queue_database_covers_enqueue() -> None:
    with pytest.raises(RuntimeError), transaction.atomic(using="queue"):
        enqueue(jobs.add, args=[1, 2])
        enqueue_many([{"task": jobs.add, "args": [3, 4]}])
        raise RuntimeError("rolled back")
    assert job_ids_in("queue") == []
    with transaction.atomic(using="queue"):
        job = enqueue(jobs.add, args=[1, 2])
        assert not in_another_thread(lambda: Job.objects.filter(pk=job.pk).exists())
    assert in_another_thread(lambda: Job.objects.filter(pk=job.pk).exists())


def test_enqueue_on_commit_of_default_follows_the_apps_transaction() -> None:
    with transaction.atomic():
        Execution.objects.create(key="order", pid=0)
        transaction.on_commit(lambda: enqueue(jobs.add, args=[1, 2]))
        assert job_ids_in("queue") == [], "nothing before the app's COMMIT"
    assert len(job_ids_in("queue")) == 1
    with pytest.raises(RuntimeError), transaction.atomic():
        transaction.on_commit(lambda: enqueue(jobs.add, args=[3, 4]))
        raise RuntimeError("rolled back")
    assert len(job_ids_in("queue")) == 1, "a rolled-back transaction enqueues nothing"


# -- the queue's own operations ------------------------------------------------------


def test_claim_finish_and_recover_in_the_queue_database() -> None:
    enqueue_many([{"task": jobs.add, "args": [i, i]} for i in range(3)])
    claimed = Job.objects.claim("worker-a", 2)
    assert len(claimed) == 2
    assert {job._state.db for job in claimed} == {"queue"}
    assert Job.objects.finish_done("worker-a", claimed) == {job.pk for job in claimed}
    late = Job.objects.claim("worker-b", 5)
    assert len(late) == 1
    assert Job.objects.recover_expired(lease_timeout=-1) == (1, 0)
    assert Job.objects.filter(status=Job.Status.QUEUED).count() == 1
    assert Job.objects.filter(status=Job.Status.DONE).count() == 2


def test_operator_actions_in_the_queue_database() -> None:
    queued = enqueue(jobs.add, args=[1, 2])
    assert Job.objects.filter(pk=queued.pk).cancel() == (1, 0)
    assert Job.objects.filter(pk=queued.pk).requeue(run_now=True) == 1
    assert Job.objects.filter(pk=queued.pk).run_now() == 1
    assert Job.objects.filter(pk=queued.pk).delete_unclaimed() == 1
    assert job_ids_in("queue") == []


@pytest.mark.processes
def test_run_jobs_drains_the_queue_database(
    processes: Processes, queue_env: Callable[..., dict[str, str]]
) -> None:
    enqueue_many({"task": jobs.record, "args": [f"job-{i}"]} for i in range(200))
    enqueue_many([{"task": jobs.fail, "max_attempts": 1}])
    proc = processes.run_jobs("--burst", "--concurrency", "2", env=queue_env())
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    assert "Finished: 200 done, 1 failed, 0 retried" in out
    assert Job.objects.filter(status=Job.Status.DONE).count() == 200
    assert Job.objects.filter(status=Job.Status.FAILED).count() == 1
    assert Execution.objects.count() == 200, "the jobs wrote the app's rows in default"
    assert not WorkerProcess.objects.exists(), "the workers signed off in the queue database"


def test_pausing_resuming_and_pruning_in_the_queue_database() -> None:
    out = io.StringIO()
    call_command("dbqueue_queue", "pause", "emails", stdout=out)
    assert QueueState.objects.using("queue").filter(paused=True).count() == 1
    enqueue(jobs.add, args=[1, 2], queue="emails")
    worker = Worker(queues=["emails"], burst=True, handle_signals=False)
    assert worker.run().processed == 0, "a paused queue is not claimed from"
    call_command("dbqueue_queue", "resume", "emails", stdout=out)
    assert Worker(queues=["emails"], burst=True, handle_signals=False).run().done == 1
    call_command("prune_jobs", "--older-than", "0", stdout=out)
    assert out.getvalue().splitlines()[-1] == "Deleted 1 finished job(s)."
    assert job_ids_in("queue") == []


# -- admin ---------------------------------------------------------------------------


@pytest.fixture
def operator() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("admin", password="pw"))
    return client


def test_admin_changelist_detail_and_action(operator: Client) -> None:
    failed = enqueue(jobs.fail, max_attempts=1)
    Job.objects.filter(pk=failed.pk).update(
        status=Job.Status.FAILED, last_error="Traceback\nValueError: boom"
    )
    changelist = reverse("admin:django_dbqueue_job_changelist")
    page = operator.get(changelist)
    assert page.status_code == 200
    assert "ValueError: boom" in page.content.decode()
    detail = operator.get(reverse("admin:django_dbqueue_job_change", args=[failed.pk]))
    assert detail.status_code == 200
    response = operator.post(
        changelist,
        {"action": "requeue_jobs", "index": "0", "_selected_action": [str(failed.pk)]},
        follow=True,
    )
    assert [str(m) for m in response.context["messages"]] == ["Requeued 1 job(s)."]
    assert Job.objects.get(pk=failed.pk).status == Job.Status.QUEUED


def test_admin_dashboard_and_worker_list(operator: Client) -> None:
    enqueue_many([{"task": jobs.add, "args": [i, i], "queue": "emails"} for i in range(3)])
    WorkerProcess.objects.create(name="host:1:abc", host="host", pid=1, queues=["emails"])
    page = operator.get(reverse("admin:django_dbqueue_job_dashboard"))
    assert page.status_code == 200
    assert "host:1:abc" in page.content.decode()
    assert [(row.queue, row.counts[0]) for row in page.context["queues"]] == [
        ("default", ("queued", 0, True)),
        ("emails", ("queued", 3, True)),
        ("reports", ("queued", 0, True)),
    ]
    workers = operator.get(reverse("admin:django_dbqueue_workerprocess_changelist"))
    assert workers.status_code == 200
    assert "host:1:abc" in workers.content.decode()


# -- locks ---------------------------------------------------------------------------


def test_the_database_counter_lives_in_the_queue_database() -> None:
    assert next_counter_value("ids", backend="database") == 1
    assert next_counter_value("ids", backend="database") == 2
    with connections["queue"].cursor() as cursor:
        cursor.execute("SELECT value FROM dbqueue_counter")
        assert [row[0] for row in cursor.fetchall()] == [2]


@pytest.mark.only_vendor("mysql", "postgres")
def test_database_locks_use_the_lock_database_alias() -> None:
    current = "SELECT DATABASE()" if CURRENT_VENDOR == "mysql" else "SELECT current_database()"
    with named_lock("report", fencing=True) as lock:
        assert lock.query(current, []) == connections["queue"].settings_dict["NAME"]
        first = lock.fencing_token
    with named_lock("report", fencing=True) as lock:
        assert lock.fencing_token == (first or 0) + 1
    assert Counter.objects.count() == 1, "the fencing counter is in the queue database"
    with dbqueue(LOCK_DATABASE_ALIAS="default"), named_lock("report") as lock:
        assert lock.query(current, []) == connections["default"].settings_dict["NAME"]


@pytest.mark.only_vendor("mysql", "postgres")
def test_a_lock_database_without_the_counter_table_is_reported() -> None:
    assert check_lock_settings() == []
    with dbqueue(LOCK_DATABASE_ALIAS="default"):
        found = [(m.id, m.msg, m.hint) for m in check_lock_settings()]
    assert found == [
        (
            "django_dbqueue.W102",
            "DBQUEUE['LOCK_DATABASE_ALIAS'] is 'default', but the database router keeps "
            "django_dbqueue's tables out of it: named_lock(fencing=True) needs the "
            "dbqueue_counter table in that database.",
            "Set LOCK_DATABASE_ALIAS to 'queue', the database of the queue's tables "
            "(see docs/databases.md).",
        )
    ]


# -- wake-up -------------------------------------------------------------------------


def test_workers_hear_jobs_when_the_queue_database_commits() -> None:
    # A queue of this test's own: other test runs publish on the same Redis channel.
    queue = f"q-{uuid.uuid4().hex[:8]}"
    with dbqueue(**WAKE, QUEUES=[*settings.DBQUEUE["QUEUES"], queue]):
        listener = wakeup.listen([queue])
        assert listener is not None
        try:
            if isinstance(listener, wakeup.PostgresListener):
                assert listener.conn.info.dbname == connections["queue"].settings_dict["NAME"]
            with transaction.atomic(using="queue"):
                enqueue(jobs.noop, queue=queue)
                assert not listener.wait(0.3), "nothing is sent before the queue's COMMIT"
            assert listener.wait(5.0)
            # Past the window in which a process announces the same queue only once.
            time.sleep(wakeup.COALESCE * 2)
            with transaction.atomic(), pytest.warns(CrossDatabaseEnqueueWarning):
                enqueue(jobs.noop, queue=queue)
                assert listener.wait(5.0), "the default database's transaction does not hold it"
        finally:
            listener.close()


@pytest.mark.processes
def test_an_idle_worker_wakes_at_once(
    processes: Processes, queue_env: Callable[..., dict[str, str]]
) -> None:
    proc = processes.run_jobs(env=queue_env(**WAKE, POLL_INTERVAL=30, MIN_POLL_INTERVAL=30))
    wait_until(lambda: WorkerProcess.objects.exists(), timeout=60)
    time.sleep(1.0)  # the worker is idle, in a 30 s poll sleep unless woken
    delays = []
    for _ in range(3):
        with dbqueue(**WAKE):
            job = enqueue(jobs.noop)
        sent = time.monotonic()
        wait_until(
            lambda j=job: Job.objects.get(pk=j.pk).status == Job.Status.DONE,
            timeout=20,
            interval=0.01,
        )
        delays.append(time.monotonic() - sent)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert max(delays) < 10, delays


# -- a queue database that was never migrated ---------------------------------------


@pytest.fixture
def empty_queue_database(tmp_path: Any) -> Iterator[str]:
    with empty_database(connections["queue"], tmp_path / "empty-queue.sqlite3") as name:
        yield name


@pytest.mark.processes
def test_run_jobs_names_the_queue_database_to_migrate(
    processes: Processes, queue_env: Callable[..., dict[str, str]], empty_queue_database: str
) -> None:
    env = {**queue_env(), "DBQUEUE_QUEUE_DB_NAME": empty_queue_database}

    def run(*args: str) -> tuple[int, str]:
        proc = processes.start(*args, env=env)
        out, _ = proc.communicate(timeout=180)
        return proc.returncode, out

    code, out = run("run_jobs", "--burst")
    assert code == 1
    tables = ", ".join(model._meta.db_table for model in QUEUE_MODELS)
    assert out.splitlines() == [
        f"CommandError: The job tables are missing from database 'queue' ({tables}): "
        "run `python manage.py migrate --database queue` first."
    ]
    assert run("migrate", "--database", "queue", "-v0") == (0, "")
    code, out = run("run_jobs", "--burst")
    assert code == 0, out
    assert "Finished: 0 done, 0 failed, 0 retried" in out
