"""What a running job reads of its dependencies (docs/workflows.md).

The worker notes which job it is running (:func:`running`, from
``worker/execution.py``); inside it, :func:`dependency_results` and
:func:`previous_result` read the results of that job's dependencies from the table.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from django.db import router

from django_dbqueue.exceptions import InvalidJob
from django_dbqueue.models import Job
from django_dbqueue.queue.dependents import results_of

CURRENT_JOB: ContextVar[int | None] = ContextVar("dbqueue_current_job", default=None)


@contextmanager
def running(job_id: int) -> Iterator[None]:
    """While job ``job_id`` runs (in this thread or task); the worker's hot path sets
    :data:`CURRENT_JOB` itself (a context manager costs microseconds per job)."""
    token = CURRENT_JOB.set(job_id)
    try:
        yield
    finally:
        CURRENT_JOB.reset(token)


def current_job_id() -> int | None:
    """The id of the job running in this thread or task (None outside a job)."""
    return CURRENT_JOB.get()


def dependency_results(job: Job | int | None = None) -> dict[int, Any]:
    """The results of ``job``'s dependencies that ended DONE, by job id (``job``: a Job,
    an id, or None for the job running now). A dependency that failed (with
    ``on_dependency_failure="run"``) or was deleted by retention is absent."""
    job_id = _job_id(job)
    return results_of(Job, router.db_for_write(Job), job_id)


def previous_result(job: Job | int | None = None) -> Any:
    """The result of the one dependency of ``job`` (a chain's step: the step before);
    None if it has none that ended DONE. More than one dependency raises InvalidJob."""
    results = dependency_results(job)
    if len(results) > 1:
        raise InvalidJob(
            "previous_result(): the job has several dependencies; use dependency_results()."
        )
    return next(iter(results.values()), None)


def _job_id(job: Job | int | None) -> int:
    if job is None:
        current = CURRENT_JOB.get()
        if current is None:
            raise InvalidJob("no job is running here: pass the job or its id.")
        return current
    job_id = getattr(job, "pk", job)
    if isinstance(job_id, bool) or not isinstance(job_id, int):
        raise InvalidJob(f"{job!r} is neither a saved job nor a job id.")
    return job_id
