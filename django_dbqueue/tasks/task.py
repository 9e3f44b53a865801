"""``DBQueueTask``: the Task class of the backend, with the queue's own per-task options.

Apart from the backend (:mod:`.backend`) so that reading a Job as a ``TaskResult``
(:mod:`.results`) can tell our Tasks from others without importing the backend.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ParamSpec, Self, TypeVar

from django_dbqueue.tasks.compat import GenericTask

P = ParamSpec("P")
T = TypeVar("T")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DBQueueTask(GenericTask[P, T]):
    """A Task with the queue's own per-task options; the backend's ``task_class``.

    ``@task(max_attempts=5, timeout=30)`` on the backport and Django 6.1+; on every
    version ``my_task.using(max_attempts=5, unique_key=f"report:{pk}")`` (and
    ``concurrency_key``/``concurrency_limit``). ``None``
    means the ``DBQUEUE`` default (``MAX_ATTEMPTS``, ``JOB_TIMEOUT``, ``RETRY_BACKOFF``).
    The fields are those of ``options.TASK_FIELDS`` that the framework's Task lacks
    (``tests/test_options.py`` holds them equal).
    """

    max_attempts: int | None = None
    timeout: float | None = None
    retry_backoff: float | None = None
    # While a job with this key waits or runs, enqueue() returns its result instead
    # of adding another job.
    unique_key: str | None = None
    # At most concurrency_limit (default 1) jobs of this key run at once; the key is a
    # format string over the call's arguments, like @job's (docs/concurrency.md).
    concurrency_key: str | None = None
    concurrency_limit: int | None = None

    def using(self, **changes: Any) -> Self:
        """A copy with other defaults: the framework's options (priority, queue_name,
        run_after, backend, and those of newer Django versions) and the fields above,
        ``options.TASK_FIELDS``; an option left at None keeps this task's value."""
        # Not super().using(): slots=True dataclasses break zero-argument super().
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})
