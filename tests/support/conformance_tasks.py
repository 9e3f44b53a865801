"""@task functions that tests/tasks/test_conformance.py runs on every backend.

Worker processes import them from here, so they stay at module level under their names.
"""

from __future__ import annotations

import asyncio
import os
import time
from datetime import UTC, datetime
from typing import Any

from django_dbqueue.tasks.compat import TaskContext, task


@task
def echo(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """What the function received, after the arguments' trip through the backend."""
    return {"args": list(args), "kwargs": kwargs}


@task
def fail(message: str) -> None:
    raise ValueError(message)


RETURNED: dict[str, Any] = {
    "none": None,
    "tuple": (1, 2),
    "bytes": b"abc",
    "nested": {"a": (1, [2, (3,)])},
}


@task
def give_back(kind: str) -> Any:
    """Return a value of the kind named (some of which JSON cannot hold)."""
    if kind == "object":
        return object()
    if kind == "datetime":
        return datetime.now(UTC)
    if kind == "set":
        return {1, 2}
    return RETURNED[kind]


@task(takes_context=True)
def describe_context(context: TaskContext[Any, Any], tag: str) -> dict[str, Any]:
    """The context the function was given, with the options of the Task it names."""
    running = context.task_result.task
    return {
        "tag": tag,
        "attempt": context.attempt,
        "id": context.task_result.id,
        "task": {
            "module_path": running.module_path,
            "priority": running.priority,
            "queue_name": running.queue_name,
            "backend": running.backend,
            "run_after": running.run_after.isoformat() if running.run_after else None,
            "takes_context": running.takes_context,
        },
    }


@task
async def async_double(value: int) -> int:
    await asyncio.sleep(0)
    return 2 * value


@task(priority=3, queue_name="reports")
def on_reports() -> str:
    return "reports"


def without_context(value: int) -> int:
    """Not a task: tests declare it with takes_context=True, which it cannot take."""
    return value


@task(takes_context=True)
def attempt_times(context: TaskContext[Any, Any], failing_attempts: int = 0) -> dict[str, Any]:
    """Fail the first ``failing_attempts`` attempts; then say what the running result read."""
    if context.attempt <= failing_attempts:
        raise RuntimeError(f"attempt {context.attempt} fails on purpose")
    result = context.task_result
    return {
        "attempt": context.attempt,
        "started_at": result.started_at.isoformat() if result.started_at else None,
        "last_attempted_at": (
            result.last_attempted_at.isoformat() if result.last_attempted_at else None
        ),
    }


@task(takes_context=True)
def wait_for_file(context: TaskContext[Any, Any], path: str, failing_attempts: int = 0) -> int:
    """Fail the first ``failing_attempts`` attempts; then run until ``path`` exists."""
    if context.attempt <= failing_attempts:
        raise RuntimeError(f"attempt {context.attempt} fails on purpose")
    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear")
        time.sleep(0.02)
    return context.attempt
