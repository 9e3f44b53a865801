"""A Job row seen as a Django Tasks ``TaskResult`` (running a ``Task`` in the worker is
:mod:`.running`'s).

Mapping (see docs/tasks.md): queued -> READY (also while it waits for a retry),
claimed -> RUNNING, done -> SUCCESSFUL, failed and cancelled -> FAILED. ``errors`` come
from ``Job.errors`` (one per failed attempt), ``worker_ids`` from ``Job.owner`` and
``Job.attempts``, ``return_value`` from ``Job.result``.
"""

from __future__ import annotations

import dataclasses
import sys
from inspect import isclass
from typing import TYPE_CHECKING, Any

from django_dbqueue.registry import resolve
from django_dbqueue.tasks.compat import (
    InvalidTask,
    InvalidTaskBackend,
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
)
from django_dbqueue.tasks.options import rebuild, stored_options
from django_dbqueue.tasks.task import DBQueueTask

if TYPE_CHECKING:
    from django_dbqueue.models import Job

STATUS_MAP: dict[str, TaskResultStatus] = {
    "queued": TaskResultStatus.READY,
    "waiting": TaskResultStatus.READY,
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
