"""@task functions the backend tests enqueue; run_jobs processes import them from here."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any, TypeVar

from django_dbqueue.tasks.compat import TaskContext, task
from testproject.models import Execution

T = TypeVar("T")


def with_options(declared: T, **options: Any) -> T:
    """``declared.using(**options)``: Django 6.0's @task passes on no backend options."""
    with_them: T = declared.using(**options)  # type: ignore[attr-defined]
    return with_them


@task
def add(a: int, b: int) -> int:
    return a + b


@task
def fail(message: str = "boom") -> None:
    raise ValueError(message)


@task(priority=10, queue_name="emails")
def record(key: str) -> str:
    """Leave a row behind, so a test sees in which order tasks ran."""
    Execution.objects.create(key=key, pid=os.getpid())
    return key


@task(takes_context=True)
def flaky(context: TaskContext[Any, Any], key: str) -> dict[str, Any]:
    """Fails on its first attempt, succeeds on the second."""
    Execution.objects.create(key=key, pid=os.getpid(), attempt=context.attempt)
    if context.attempt < 2:
        raise RuntimeError(f"{key}: attempt {context.attempt} failed")
    return {
        "attempt": context.attempt,
        "id": context.task_result.id,
        "worker_ids": context.task_result.worker_ids,
    }


@task
async def async_add(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a + b


@task
def too_slow(seconds: float) -> None:
    time.sleep(seconds)


too_slow = with_options(too_slow, max_attempts=1, timeout=0.5)


def _helper() -> int:
    return 1


# Declared under another name than its function's: workers could not find this Task.
renamed = task(_helper)


@task
async def async_too_slow(seconds: float) -> None:
    await asyncio.sleep(seconds)


async_too_slow = with_options(async_too_slow, max_attempts=1, timeout=0.3)


@task
def hold(path: str) -> str:
    """Runs until ``path`` exists (at most a minute): a Task a test can watch running."""
    deadline = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    return path
