"""A Job row seen as a Django Tasks ``TaskResult``, and running a ``Task`` in the worker.

Mapping (see docs/tasks.md): queued -> READY (also while it waits for a retry),
claimed -> RUNNING, done -> SUCCESSFUL, failed and cancelled -> FAILED. ``errors`` come
from ``Job.errors`` (one per failed attempt), ``worker_ids`` from ``Job.owner`` and
``Job.attempts``, ``return_value`` from ``Job.result``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from inspect import isclass
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from django_dbqueue.exceptions import TaskNotFound
from django_dbqueue.registry import find, resolve
from django_dbqueue.tasks.backend import DBQueueBackend, DBQueueTask
from django_dbqueue.tasks.compat import (
    BaseTaskBackend,
    InvalidTask,
    InvalidTaskBackend,
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    normalize_json,
    task_backends,
    task_finished,
    task_started,
)
from django_dbqueue.tasks.options import rebuild, stored_options

if TYPE_CHECKING:
    from django_dbqueue.models import Job

logger = logging.getLogger("django_dbqueue.tasks")

STATUS_MAP: dict[str, TaskResultStatus] = {
    "queued": TaskResultStatus.READY,
    "claimed": TaskResultStatus.RUNNING,
    "done": TaskResultStatus.SUCCESSFUL,
    "failed": TaskResultStatus.FAILED,
    "cancelled": TaskResultStatus.FAILED,
}


class StoredTaskError(TaskError):
    """A ``TaskError`` read from a row: its class is looked up, never imported.

    The framework's ``exception_class`` imports whatever ``exception_class_path`` names;
    the path comes from a row, which anyone with write access to the table can craft, so
    importing it would run that module's code in the reader's process. Here the class is
    resolved only among modules this process has already imported (exception classes the
    worker recorded are normally among them); anything else raises ``ValueError`` naming
    the path, as the framework does for a path that is not an exception.
    """

    __slots__ = ()

    @property
    def exception_class(self) -> type[BaseException]:
        found = loaded_exception_class(self.exception_class_path)
        if found is None:
            raise ValueError(
                f"{self.exception_class_path!r} is not an exception class of a module "
                "this process has imported; stored paths are never imported on read."
            )
        return found


def loaded_exception_class(path: str) -> type[BaseException] | None:
    """The exception class ``path`` names, if its module is in ``sys.modules``, else None.

    Attributes are read from the module's ``__dict__``: a module-level ``__getattr__``
    (PEP 562) could import on access.
    """
    parts = path.split(".")
    # The longest loaded module prefix: a class nested in a class ("m.Outer.Inner") too.
    for cut in range(len(parts) - 1, 0, -1):
        found: object = sys.modules.get(".".join(parts[:cut]))
        if found is None:
            continue
        for name in parts[cut:]:
            found = vars(found).get(name) if hasattr(found, "__dict__") else None
        if isclass(found) and issubclass(found, BaseException):
            return found
        return None
    return None


def task_of_job(job: Job, target: object = None) -> Task[..., Any]:
    """The Task a job runs: for a job enqueued through the Tasks API, the Task enqueued.

    ``target`` is what ``job.task`` resolves to, when the caller has it already.
    Raises TaskResultDoesNotExist when the job runs a plain function, and TaskNotFound
    when its task no longer imports.
    """
    if target is None:
        target = resolve(job.task)
    if not isinstance(target, Task):
        raise TaskResultDoesNotExist(
            f"Job {job.pk} runs {job.task}, a plain function, not a Django Tasks task; "
            "read it with django_dbqueue.models.Job instead."
        )
    changes: dict[str, Any] = {"priority": job.priority, "queue_name": job.queue}
    if job.backend:
        changes["backend"] = job.backend
        changes.update(stored_options(job))
        return rebuild(target, changes)
    # django_dbqueue.enqueue() given a Task object: the options are enqueue()'s, in the
    # columns. A job's run_after is its enqueue time unless it was deferred.
    changes["run_after"] = job.run_after if job.run_after > job.created_at else None
    if isinstance(target, DBQueueTask):
        changes.update(
            max_attempts=job.max_attempts,
            timeout=job.timeout,
            retry_backoff=job.retry_backoff,
            unique_key=job.unique_key,
        )
    try:
        # Options the framework refuses (a priority of 500...) leave the task as declared.
        return dataclasses.replace(target, **changes)
    except (InvalidTask, InvalidTaskBackend):
        return target


def task_result_from_job(job: Job, task: Task[..., Any] | None = None) -> TaskResult[..., Any]:
    task = task or task_of_job(job)
    status = STATUS_MAP[job.status]
    result: TaskResult[..., Any] = TaskResult(
        task=task,
        id=str(job.pk),
        status=status,
        enqueued_at=job.created_at,
        started_at=job.started_at,
        last_attempted_at=job.attempt_started_at,
        finished_at=job.finished_at,
        args=list(job.args or []),
        kwargs=dict(job.kwargs or {}),
        backend=job.backend or task.backend,
        errors=[
            StoredTaskError(
                exception_class_path=str(error.get("exception_class_path", "")),
                traceback=str(error.get("traceback", "")),
            )
            for error in (job.errors or [])
        ],
        worker_ids=_worker_ids(job),
    )
    if status == TaskResultStatus.SUCCESSFUL:
        # TaskResult is frozen; the framework's own backends set the value this way.
        object.__setattr__(result, "_return_value", job.result)
    return result


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
        job.started_at = timezone.now()
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


def _worker_ids(job: Job) -> list[str]:
    """One worker id per attempt (the framework counts attempts as ``len(worker_ids)``).

    Failed attempts name their worker in ``Job.errors``; the latest attempt, and any
    attempt without an entry (recovered after a crash, or past ``KEEP_ERRORS``), is
    credited to ``Job.owner``.
    """
    if not job.attempts or not job.owner:
        return []
    failed = [str(error.get("worker") or job.owner) for error in (job.errors or [])]
    missing = max(job.attempts - len(failed), 0)
    return (failed + [job.owner] * missing)[-job.attempts :]
