"""The task registry: only @job functions and Django Tasks @task objects ever run.

Each attack of issue 13 is a test: a task path or callable that named arbitrary code
(os.system, subprocess.call, eval, exec, settings.__getattr__) is refused at enqueue and
failed at once by the worker, without importing anything.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.db import connection

from django_dbqueue import enqueue, enqueue_many, job, registry
from django_dbqueue.checks import check_scheduled_tasks, check_task_settings
from django_dbqueue.exceptions import InvalidJob, UnregisteredTask
from django_dbqueue.models import Job
from django_dbqueue.worker.loop import Worker
from tests.support import ROOT, Processes, jobs, task_functions

pytestmark = pytest.mark.django_db

SIDE_EFFECT_MODULE = "tests.support.import_side_effect"


def unregistered(path: str) -> str:
    """The exact refusal, as a regular expression."""
    return (
        f"task '{path}' is not a registered task; decorate it with @job or list its "
        r"module in DBQUEUE\['TASK_MODULES'\]"
    )


@pytest.fixture
def fresh_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A registry this test may change, discovered again on first use."""
    monkeypatch.setattr(registry, "_registry", dict(registry._registry))
    monkeypatch.setattr(registry, "_discovered", False)
    yield


@pytest.fixture
def side_effect_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the never-imported module would leave its trace."""
    assert SIDE_EFFECT_MODULE not in sys.modules
    marker = tmp_path / "imported"
    monkeypatch.setenv("DBQUEUE_SIDE_EFFECT_FILE", str(marker))
    return marker


def drain() -> Worker:
    worker = Worker(burst=True, handle_signals=False)
    worker.run()
    return worker


def write_row(task: str, args: list[Any]) -> Job:
    """A job row whose task is set with plain SQL, as an attacker with INSERT would."""
    job_row = Job.objects.create(task="tests.support.jobs.noop", args=args)
    table = connection.ops.quote_name(Job._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET {connection.ops.quote_name('task')} = %s "  # noqa: S608
            f"WHERE {connection.ops.quote_name('id')} = %s",
            [task, job_row.pk],
        )
    return job_row


# -- @job ------------------------------------------------------------------------------


@job
def plain_registered(a: int) -> int:
    return a * 2


@job(queue="emails", priority=7, max_attempts=5, timeout=30, retry_backoff=4)
def with_defaults() -> None:
    return None


def never_registered() -> None:
    return None


def test_job_registers_under_its_dotted_path_and_returns_the_function() -> None:
    entry = registry.registered("tests.test_registry.plain_registered")
    assert entry is not None and entry.func is plain_registered
    assert plain_registered(21) == 42, "calling it directly still runs it"
    found = registry.find("tests.test_registry.plain_registered")
    assert (found.func, found.is_framework_task) == (plain_registered, False)


def test_job_defaults_apply_to_every_enqueue_and_an_argument_wins() -> None:
    first = enqueue(with_defaults)
    assert (first.queue, first.priority, first.max_attempts) == ("emails", 7, 5)
    assert (first.timeout, first.retry_backoff) == (30.0, 4.0)
    by_path = enqueue("tests.test_registry.with_defaults", queue="default", max_attempts=1)
    assert (by_path.queue, by_path.priority, by_path.max_attempts) == ("default", 7, 1)
    [many] = enqueue_many([{"task": with_defaults}])
    assert (many.queue, many.max_attempts) == ("emails", 5)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"timeout": float("nan")}, "timeout must be a finite number"),
        ({"max_attempts": 2**31}, "max_attempts must be an integer of at least 1 and at most"),
        ({"queue": ""}, "queue must be a non-empty string"),
        ({"priority": 10**6}, "priority must be between"),
        ({"retry_backoff": float("inf")}, "retry_backoff must be a finite number"),
    ],
)
def test_job_refuses_bad_defaults_when_declared(options: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidJob, match=message):
        job(**options)


def _lambda_and_nested() -> list[Callable[..., Any]]:
    def nested() -> None:
        return None

    return [lambda: None, nested]


def test_job_refuses_what_a_worker_could_never_find(fresh_registry: None) -> None:
    lam, nested = _lambda_and_nested()
    with pytest.raises(TypeError, match="lambdas have no name"):
        job(lam)
    with pytest.raises(TypeError, match="defined inside a function"):
        job(nested)
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec("def in_script():\n    return None", namespace)
    with pytest.raises(TypeError, match="defined in __main__"):
        job(namespace["in_script"])


def test_job_takes_async_functions_and_refuses_generators_classes_and_tasks(
    fresh_registry: None,
) -> None:
    async def coroutine() -> None:
        return None

    async def generator() -> Any:
        yield 1

    coroutine.__qualname__ = "coroutine"  # module level, as far as @job can tell
    generator.__qualname__ = "generator"
    assert job(coroutine) is coroutine
    entry = registry.registered(f"{__name__}.coroutine")
    assert entry is not None and entry.is_async
    with pytest.raises(TypeError, match="async generator"):
        job(generator)
    with pytest.raises(TypeError, match="decorates functions"):
        job(Worker)
    with pytest.raises(TypeError, match="is a Django Tasks task"):
        job(task_functions.add)


# -- the attacks: enqueue refuses, without importing ------------------------------------


def test_enqueue_refuses_os_system_by_path() -> None:
    with pytest.raises(InvalidJob, match=unregistered("os.system")):
        enqueue("os.system", args=["touch /tmp/dbqueue-pwned"])
    assert Job.objects.count() == 0


def test_enqueue_refuses_os_system_as_a_callable() -> None:
    with pytest.raises(InvalidJob, match=unregistered(f"{os.system.__module__}.system")):
        enqueue(os.system, args=["touch /tmp/dbqueue-pwned"])
    assert Job.objects.count() == 0


def test_enqueue_refuses_subprocess_call() -> None:
    with pytest.raises(InvalidJob, match=unregistered("subprocess.call")):
        enqueue(subprocess.call, args=[["touch", "/tmp/dbqueue-pwned"]])
    with pytest.raises(InvalidJob, match=unregistered("subprocess.call")):
        enqueue("subprocess.call", args=[["touch", "/tmp/dbqueue-pwned"]])
    assert Job.objects.count() == 0


def test_enqueue_refuses_builtins_eval() -> None:
    with pytest.raises(InvalidJob, match=unregistered("builtins.eval")):
        enqueue("builtins.eval", args=["__import__('os').system('id')"])
    assert Job.objects.count() == 0


def test_enqueue_refuses_builtins_exec() -> None:
    with pytest.raises(InvalidJob, match=unregistered("builtins.exec")):
        enqueue("builtins.exec", args=["import os; os.system('id')"])
    assert Job.objects.count() == 0


def test_enqueue_refuses_settings_getattr() -> None:
    path = "django.conf.settings.__getattr__"
    with pytest.raises(InvalidJob, match=unregistered(path)):
        enqueue(path, args=["DATABASES"])
    assert Job.objects.count() == 0


def test_enqueue_refuses_a_plain_function() -> None:
    with pytest.raises(InvalidJob, match=unregistered("tests.test_registry.never_registered")):
        enqueue(never_registered)
    assert Job.objects.count() == 0


def test_checking_a_refused_path_imports_nothing(side_effect_file: Path) -> None:
    with pytest.raises(InvalidJob, match=unregistered(f"{SIDE_EFFECT_MODULE}.run")):
        enqueue(f"{SIDE_EFFECT_MODULE}.run")
    assert SIDE_EFFECT_MODULE not in sys.modules
    assert not side_effect_file.exists()
    assert Job.objects.count() == 0


def test_an_unregistered_path_is_refused_after_discovery_without_importing(
    fresh_registry: None, side_effect_file: Path
) -> None:
    with pytest.raises(UnregisteredTask):
        enqueue(f"{SIDE_EFFECT_MODULE}.run")
    assert registry._discovered, "the allowed modules were imported, nothing else"
    assert SIDE_EFFECT_MODULE not in sys.modules
    assert not side_effect_file.exists()


def test_unvalidated_producers_may_store_unknown_paths_but_not_unregistered_callables(
    settings: Any,
) -> None:
    settings.DBQUEUE = {**settings.DBQUEUE, "VALIDATE_TASKS": False}
    stored = enqueue("other_service.jobs.work")
    assert stored.task == "other_service.jobs.work"
    with pytest.raises(InvalidJob, match=unregistered("tests.test_registry.never_registered")):
        enqueue(never_registered)


# -- the attacks: the worker fails the row at once, without importing --------------------


@pytest.mark.parametrize(
    ("task", "args"),
    [
        ("os.system", ["touch /tmp/dbqueue-pwned"]),
        ("subprocess.call", [["touch", "/tmp/dbqueue-pwned"]]),
        ("builtins.eval", ["__import__('os').system('touch /tmp/dbqueue-pwned')"]),
        ("builtins.exec", ["import os; os.system('touch /tmp/dbqueue-pwned')"]),
    ],
)
def test_worker_fails_a_row_naming_arbitrary_code_at_once(task: str, args: list[Any]) -> None:
    row = write_row(task, args)
    worker = drain()
    row.refresh_from_db()
    assert (row.status, row.attempts, row.result) == (Job.Status.FAILED, 1, None)
    assert unregistered(task).replace("\\", "") in row.last_error
    assert worker.stats.failed == 1 and worker.stats.retried == 0
    assert not Path("/tmp/dbqueue-pwned").exists()


def test_worker_never_stores_settings_through_getattr() -> None:
    row = write_row("django.conf.settings.__getattr__", ["DATABASES"])
    drain()
    row.refresh_from_db()
    assert (row.status, row.attempts, row.result) == (Job.Status.FAILED, 1, None)
    assert str(connection.settings_dict["NAME"]) not in row.last_error


def test_worker_fails_a_row_of_an_unimported_module_without_importing_it(
    side_effect_file: Path,
) -> None:
    row = write_row(f"{SIDE_EFFECT_MODULE}.run", [])
    drain()
    row.refresh_from_db()
    assert (row.status, row.attempts) == (Job.Status.FAILED, 1)
    assert SIDE_EFFECT_MODULE not in sys.modules
    assert not side_effect_file.exists()


def test_find_raises_unregistered_task_for_any_unknown_path() -> None:
    for path in ("os.system", "builtins.eval", "django.conf.settings.__getattr__", "x.y"):
        with pytest.raises(UnregisteredTask, match=unregistered(path)):
            registry.find(path)


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_a_real_worker_process_refuses_os_system(
    processes: Processes, worker_env: Callable[..., dict[str, str]], tmp_path: Path
) -> None:
    pwned = tmp_path / "pwned"
    imported = tmp_path / "imported"
    rows = [
        write_row("os.system", [f"touch {pwned}"]),
        write_row(f"{SIDE_EFFECT_MODULE}.run", []),
    ]
    ok = enqueue(jobs.add, [1, 2])
    env = {**worker_env(), "DBQUEUE_SIDE_EFFECT_FILE": str(imported)}
    proc = processes.run_jobs("--burst", env=env)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    for row in rows:
        row.refresh_from_db()
        assert (row.status, row.attempts) == (Job.Status.FAILED, 1)
        assert "is not a registered task" in row.last_error
    assert Job.objects.get(pk=ok.pk).result == 3
    assert not pwned.exists()
    assert not imported.exists()


# -- Django Tasks ----------------------------------------------------------------------


def test_task_objects_count_as_registered() -> None:
    entry = registry.find("tests.support.task_functions.add")
    assert entry.is_framework_task and entry.func is task_functions.add
    stored = enqueue("tests.support.task_functions.add", args=[1, 2])
    assert stored.task == "tests.support.task_functions.add"


def test_a_plain_function_under_a_task_name_is_not_a_task() -> None:
    # renamed = task(_helper): the path names the undecorated _helper.
    with pytest.raises(UnregisteredTask):
        registry.find("tests.support.task_functions._helper")


# -- discovery ---------------------------------------------------------------------------


def test_discovery_imports_app_task_modules_and_task_modules(fresh_registry: None) -> None:
    paths = {entry.path for entry in registry.all_tasks()}
    assert "testproject.jobs.checksum" in paths, "an installed app's jobs.py"
    assert "tests.support.jobs.add" in paths, "DBQUEUE['TASK_MODULES']"
    assert "tests.support.task_functions.flaky" in paths, "a @task of a task module"


def test_a_missing_task_module_is_a_configuration_error(
    fresh_registry: None, settings: Any
) -> None:
    settings.DBQUEUE = {**settings.DBQUEUE, "TASK_MODULES": ["tests.support.no_such_module"]}
    with pytest.raises(ImproperlyConfigured, match="no_such_module"):
        registry.discover()
    assert not registry._discovered
    [error] = check_task_settings()
    assert error.id == "django_dbqueue.E402"


def test_dbqueue_tasks_lists_path_queue_and_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    call_command("dbqueue_tasks")
    out = capsys.readouterr().out
    header = out.splitlines()[0].split()
    assert header == [
        "path",
        "kind",
        "queue",
        "priority",
        "max_attempts",
        "timeout",
        "retry_backoff",
    ]
    line = next(ln for ln in out.splitlines() if ln.startswith("testproject.jobs.build_report"))
    assert line.split()[1:5] == ["@job", "reports", "0", "1"]
    assert any(ln.startswith("tests.support.task_functions.add ") for ln in out.splitlines())


def test_dbqueue_tasks_in_a_fresh_process_shows_what_a_worker_imports() -> None:
    """Only task modules are imported: the benchmark's @job noop, registered when
    bench.py is imported, is not in a worker's registry."""
    env = {**os.environ, "DBQUEUE_DB": "sqlite", "DBQUEUE_DB_NAME": ":memory:"}
    out = subprocess.run(
        [sys.executable, "manage.py", "dbqueue_tasks", "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    rows = {row["path"]: row for row in json.loads(out)}
    assert rows["testproject.jobs.send_welcome_mail"]["queue"] == "emails"
    assert rows["tests.support.task_functions.record"]["kind"] == "@task"
    assert "django_dbqueue.bench.runs.noop" not in rows
    assert not [path for path in rows if path.startswith(("os.", "builtins.", "subprocess."))]


# -- checks ----------------------------------------------------------------------------


def test_check_flags_a_job_default_queue_that_does_not_exist(
    fresh_registry: None, settings: Any
) -> None:
    registry.register(never_registered, queue="nowhere")
    assert [e.id for e in check_task_settings()] == ["django_dbqueue.E403"]


@pytest.mark.parametrize(
    ("key", "value", "check_id"),
    [
        ("TASK_MODULES", "tests.support.jobs", "django_dbqueue.E401"),
        ("MAX_PAYLOAD_BYTES", 0, "django_dbqueue.E404"),
        ("ADMIN_SHOW_PAYLOADS", "everyone", "django_dbqueue.E405"),
        ("MAX_ATTEMPTS", 2**31, "django_dbqueue.E406"),
        ("JOB_TIMEOUT", float("inf"), "django_dbqueue.E406"),
    ],
)
def test_checks_refuse_bad_settings(settings: Any, key: str, value: Any, check_id: str) -> None:
    settings.DBQUEUE = {**settings.DBQUEUE, key: value}
    assert [e.id for e in check_task_settings()] == [check_id]


def test_checks_pass_on_the_test_project() -> None:
    assert check_task_settings() == []


def test_a_schedule_naming_an_unregistered_task_is_a_check_error(settings: Any) -> None:
    settings.DBQUEUE = {
        **settings.DBQUEUE,
        "SCHEDULE": {
            "pwn": {"task": "os.system", "every": 60, "args": ["id"]},
            "fine": {"task": "tests.support.jobs.noop", "every": 60},
        },
    }
    [error] = check_scheduled_tasks()
    assert error.id == "django_dbqueue.E305" and "'pwn'" in error.msg
