"""Running a Django Tasks ``Task`` in the worker, and the framework's signals around it.

:func:`run_task` is what ``worker/execution.call_job`` calls for a job whose task is a
``Task`` (installed by ``tasks.ready()``); :func:`send_finished` sends ``task_finished``
once the job's outcome is recorded.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from django_dbqueue.exceptions import TaskNotFound
from django_dbqueue.queue import clock
from django_dbqueue.registry import find
from django_dbqueue.tasks.backend import DBQueueBackend
from django_dbqueue.tasks.compat import (
    BaseTaskBackend,
    InvalidTaskBackend,
    TaskContext,
    TaskResultDoesNotExist,
    normalize_json,
    task_backends,
    task_finished,
    task_started,
)
from django_dbqueue.tasks.results import task_of_job, task_result_from_job

if TYPE_CHECKING:
    from django_dbqueue.models import Job

logger = logging.getLogger("django_dbqueue.tasks")


def backend_class(alias: str) -> type[BaseTaskBackend]:
    """The class the framework's signals name as sender."""
    try:
        return type(task_backends[alias])
    except InvalidTaskBackend:
        return DBQueueBackend


def run_task(target: object, job: Job) -> Any:
    """Run one attempt of the Task ``target`` for ``job``; the worker's call_job() calls it.

    Returns the value as the framework normalizes it (tuples to lists, bytes to str). A
    value that cannot be stored raises a plain ``TypeError``, recorded as that, as the
    framework's own backends record it.
    """
    task = task_of_job(job, target)
    if job.started_at is None:
        job.started_at = clock.queue_now()
    result = task_result_from_job(job, task)
    task_started.send(backend_class(result.backend), task_result=result)
    args, kwargs = list(job.args or []), dict(job.kwargs or {})
    if task.takes_context:
        value = task.call(TaskContext(task_result=result), *args, **kwargs)
    else:
        value = task.call(*args, **kwargs)
    try:
        return json.loads(json.dumps(normalize_json(value), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"Task {task.module_path} returned {type(value).__name__}, which cannot be stored "
            f"as JSON ({exc}); return plain data (or None) from tasks."
        ) from None


def send_finished(job: Job) -> None:
    """Send the framework's ``task_finished`` for a job that ran a Task (else nothing)."""
    try:
        entry = find(job.task)
    except TaskNotFound:
        return
    target = entry.func
    if not entry.is_framework_task:
        return  # a plain function: the common case, decided without building anything
    try:
        result = task_result_from_job(job, task_of_job(job, target))
    except (TaskResultDoesNotExist, TaskNotFound):
        return  # a plain function, or a task that never imported: nothing to report
    except Exception:
        # Runs inside the worker's bookkeeping: report, never stop the worker.
        logger.exception("Could not build the TaskResult of job %s for task_finished", job.pk)
        return
    # send_robust: a broken receiver must not stop the worker recording other jobs.
    for receiver, response in task_finished.send_robust(
        backend_class(result.backend), task_result=result
    ):
        if isinstance(response, Exception):
            logger.error(
                "task_finished receiver %r failed for job %s",
                receiver,
                job.pk,
                exc_info=response,
            )
