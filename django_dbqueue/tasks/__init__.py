"""The Django Tasks room: a backend that stores ``@task`` calls as jobs (:mod:`.backend`),
jobs read back as ``TaskResult`` (:mod:`.results`), and the framework import (:mod:`.compat`).

Nothing here is imported unless the project uses Django Tasks: the framework may be absent.
"""

from __future__ import annotations

import logging
from importlib import import_module
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any

from django.conf import settings as django_settings

from django_dbqueue import signals

if TYPE_CHECKING:
    from django_dbqueue.models import Job


def framework_available() -> bool:
    """Django 6's ``django.tasks`` or the ``django-tasks`` backport is importable."""
    return find_spec("django.tasks") is not None or find_spec("django_tasks") is not None


# task_finished is sent once the outcome is in the database (the queue's own signals
# fire after the write), so a receiver that calls get_result() sees the final state.
# Attempts that will be retried are not "finished": the task is READY again. The
# framework is imported only when a job finishes, not when the app loads.
def on_job_finished(sender: Any, job: Job, **kwargs: Any) -> None:
    from django_dbqueue.tasks.running import send_finished

    send_finished(job)


def run_task(target: Any, job: Job) -> Any:
    """Run one attempt of the Task ``target`` for ``job`` (the worker's call_job() calls
    it for Tasks); the framework is imported at the first such call."""
    from django_dbqueue.tasks.running import run_task as run

    return run(target, job)


def on_job_failed(
    sender: Any, job: Job, will_retry: bool, exception: object = None, **kwargs: Any
) -> None:
    if will_retry:
        return
    from django_dbqueue.tasks.running import send_finished

    if not isinstance(exception, BaseException):
        send_finished(job)
        return
    # The framework's task_finished logging reads sys.exc_info() (logger.exception on
    # the backport), as its own backends send the signal inside their ``except``: raise
    # the task's exception again so that the log line, and error trackers hooked to
    # logging, carry it instead of "NoneType: None". Re-raising adds this frame to its
    # traceback and may set its context; both are put back.
    traceback, context = exception.__traceback__, exception.__context__
    try:
        raise exception
    except BaseException:
        send_finished(job)
    finally:
        exception.__traceback__, exception.__context__ = traceback, context


def ready() -> None:
    """Wire the Tasks room into the app; AppConfig.ready() calls this when the framework
    is installed."""
    connect_signals()
    register_framework_checks()
    # Imported here, not above: this package must import before the app registry is
    # ready (settings may name the backend), and the worker's modules import models.
    from django_dbqueue.worker import execution

    execution.set_task_runner(run_task)


def connect_signals() -> None:
    """Bridge the queue's signals to the framework's."""
    signals.job_finished.connect(on_job_finished, dispatch_uid="django_dbqueue.task_finished.done")
    signals.job_failed.connect(on_job_failed, dispatch_uid="django_dbqueue.task_finished.failed")


def log_task_states(stream: Any, verbosity: int) -> None:
    """Let the framework's task state lines (``Task id=... path=... state=RUNNING``) reach
    the worker's output when nothing else would, as the backport's reference worker does.

    The framework logs them from its own signal receivers, to ``django.tasks`` (Django 6)
    or ``django_tasks`` (the backport). Django's default logging shows the first through
    the ``django`` logger; the second has no handler unless the project gives it one, so
    on Django 5.2 the worker printed none of them. A logger that has a handler (the
    project's, or Django's) is left as it is; one without gets ``stream`` at the level
    ``verbosity`` asks for (0: critical only, 1: info, 2 and more: debug).
    """
    name = "django.tasks" if find_spec("django.tasks") is not None else "django_tasks"
    framework_logger = logging.getLogger(name)
    if framework_logger.hasHandlers():
        return
    levels = {0: logging.CRITICAL, 1: logging.INFO}
    framework_logger.setLevel(levels.get(verbosity, logging.DEBUG))
    framework_logger.addHandler(logging.StreamHandler(stream))


def register_framework_checks() -> None:
    """Make ``manage.py check`` run the Tasks backends' checks (DBQueueBackend's among them).

    Django 6 registers them when ``django.tasks`` is first imported, which nothing does at
    startup unless the project's own code happens to; the backport registers them when
    its app is ready, if it is in INSTALLED_APPS. Only projects that configure this
    backend get the import. Registering twice is harmless: the registry is a set.
    """
    configured = getattr(django_settings, "TASKS", None)
    if not isinstance(configured, dict) or not any(
        str(entry.get("BACKEND", "")).startswith("django_dbqueue.")
        for entry in configured.values()
        if isinstance(entry, dict)
    ):
        return
    if find_spec("django.tasks") is not None:
        import_module("django.tasks")
    else:
        import_module("django_tasks.checks")
