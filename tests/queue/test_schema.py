"""``run_jobs`` before ``migrate`` says to run migrate, in one line, from a real process."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.apps import apps
from django.db import connection
from django.db.migrations.loader import MigrationLoader

from tests.support import Processes
from tests.support import empty_database as support_empty_database

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]


@pytest.fixture
def empty_database(transactional_db: None, tmp_path: Path) -> Iterator[str]:
    """The name of a database with nothing in it, on this run's server."""
    with support_empty_database(connection, tmp_path / "empty.sqlite3") as name:
        yield name


@pytest.fixture
def run(
    processes: Processes, worker_env: Callable[..., dict[str, str]], empty_database: str
) -> Callable[..., tuple[int, str]]:
    """Run a manage.py command on the empty database: (exit code, output)."""
    env = {**worker_env(), "DBQUEUE_DB_NAME": empty_database}

    def run(*args: str) -> tuple[int, str]:
        proc = processes.start(*args, env=env)
        out, _ = proc.communicate(timeout=180)
        return proc.returncode, out

    return run


def job_tables() -> str:
    """The app's tables in model order (dbqueue_job, dbqueue_worker, ...)."""
    return ", ".join(m._meta.db_table for m in apps.get_app_config("django_dbqueue").get_models())


def last_two_migrations() -> tuple[str, str]:
    graph = MigrationLoader(None).graph
    (leaf,) = graph.leaf_nodes("django_dbqueue")
    (parent,) = [p.key for p in graph.node_map[leaf].parents if p.key[0] == "django_dbqueue"]
    return parent[1], leaf[1]


def test_run_jobs_on_an_empty_database_says_to_migrate(run: Callable[..., tuple[int, str]]) -> None:
    code, out = run("run_jobs", "--burst")
    assert code == 1
    assert out.splitlines() == [
        f"CommandError: The job tables are missing from database 'default' ({job_tables()}): "
        "run `python manage.py migrate` first."
    ]


def test_run_jobs_with_the_newest_migration_unapplied_says_to_migrate_then_runs(
    processes: Processes, worker_env: Callable[..., dict[str, str]]
) -> None:
    """On the test database, whose schema is complete: its newest migration's record is
    taken away (``--fake``) and put back. (Migrating an empty database instead cost 40 s
    on MariaDB.)"""
    env = worker_env()

    def run(*args: str) -> tuple[int, str]:
        proc = processes.start(*args, env=env)
        out, _ = proc.communicate(timeout=180)
        return proc.returncode, out

    previous, newest = last_two_migrations()
    # As after upgrading django-dbqueue without running migrate: the schema is there, the
    # newest migration is not recorded.
    assert run("migrate", "django_dbqueue", previous, "--fake", "-v0") == (0, "")
    try:
        code, out = run("run_jobs", "--burst")
    finally:
        assert run("migrate", "django_dbqueue", "--fake", "-v0") == (0, "")
    assert code == 1
    assert out.splitlines() == [
        f"CommandError: Database 'default' has unapplied django_dbqueue migrations ({newest}): "
        "run `python manage.py migrate` first."
    ]
    code, out = run("run_jobs", "--burst")
    assert code == 0, out
    assert "Finished: 0 done, 0 failed, 0 retried" in out


@pytest.mark.only_vendor("mysql", "postgres")
def test_run_jobs_on_an_unreachable_database_retries_as_before(
    processes: Processes, worker_env: Callable[..., dict[str, str]]
) -> None:
    # No database of this name: the check cannot tell, so the worker's retrying takes over.
    env = {**worker_env(), "DBQUEUE_DB_NAME": f"{connection.settings_dict['NAME']}_absent"}
    proc = processes.run_jobs("--burst", env=env)
    killer = threading.Timer(60, proc.kill)
    killer.start()
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(3)]
    finally:
        proc.kill()
        killer.cancel()
    # Nothing runs before the database answers: one line per retry, naming the alias, the
    # server and why (tests/worker/test_record.py has Ctrl-C meanwhile).
    for line in lines:
        assert line.startswith("database 'default' at "), lines
        assert "_absent" in line and "retrying in" in line, lines
