"""The framework's task state lines reach run_jobs' output on Django 5.2 (the backport's
``django_tasks`` logger) as on Django 6 (``django.tasks``)."""

from __future__ import annotations

import io
import logging
from collections.abc import Callable, Iterator

import pytest

from django_dbqueue import tasks as tasks_room
from django_dbqueue.tasks.compat import FRAMEWORK_MODULE
from tests.support import Processes
from tests.support import conformance_tasks as tasks

FRAMEWORK_LOGGER = "django.tasks" if FRAMEWORK_MODULE == "django.tasks" else "django_tasks"


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("debug", ["1", ""])
def test_run_jobs_prints_each_state_of_a_task(
    processes: Processes, worker_env: Callable[..., dict[str, str]], debug: str
) -> None:
    result = tasks.echo.enqueue("logged")
    env = worker_env()
    env["DJANGO_DEBUG"] = debug
    proc = processes.run_jobs("--burst", env=env)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    line = f"Task id={result.id} path=tests.support.conformance_tasks.echo state="
    states = [part.split()[0] for part in out.split(line)[1:]]
    if FRAMEWORK_MODULE == "django.tasks" and not debug:
        # Django 6 logs through the "django" logger, whose console handler writes only
        # with DEBUG on: the project's logging decides, and nothing is added to it.
        assert states == [], out
    else:
        assert states == ["RUNNING", "SUCCESSFUL"], out


@pytest.fixture
def framework_logger() -> Iterator[logging.Logger]:
    logger = logging.getLogger(FRAMEWORK_LOGGER)
    handlers, level, propagate = list(logger.handlers), logger.level, logger.propagate
    yield logger
    logger.handlers[:] = handlers
    logger.setLevel(level)
    logger.propagate = propagate


@pytest.mark.parametrize(
    ("verbosity", "level"), [(0, logging.CRITICAL), (1, logging.INFO), (3, logging.DEBUG)]
)
def test_a_logger_without_handlers_gets_the_workers_output(
    framework_logger: logging.Logger, verbosity: int, level: int
) -> None:
    framework_logger.handlers.clear()
    framework_logger.propagate = False  # no handler above it either
    stream = io.StringIO()
    tasks_room.log_task_states(stream, verbosity)
    assert framework_logger.level == level
    framework_logger.critical("Task id=1 path=a.b state=FAILED")
    assert stream.getvalue() == "Task id=1 path=a.b state=FAILED\n"


def test_a_logger_the_project_configured_is_left_alone(framework_logger: logging.Logger) -> None:
    own = logging.NullHandler()
    framework_logger.handlers[:] = [own]
    framework_logger.setLevel(logging.WARNING)
    tasks_room.log_task_states(io.StringIO(), 2)
    assert framework_logger.handlers == [own] and framework_logger.level == logging.WARNING
