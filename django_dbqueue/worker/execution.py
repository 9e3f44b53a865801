"""Running one job's callable: look it up in the registry, call it, enforce its timeout.

An ``async def`` job is awaited by :func:`acall_job` on the event loop of the asyncio
executor (``run_jobs --async-concurrency N``); without one, :func:`call_job` runs it to
completion on an event loop of its own, one job at a time.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from django_dbqueue import bounds, registry
from django_dbqueue.conf import settings
from django_dbqueue.exceptions import InvalidJob, JobTimeout
from django_dbqueue.models import Job
from django_dbqueue.observability import hooks
from django_dbqueue.workflows.results import CURRENT_JOB


class ResultNotSerializable(TypeError):
    """The job returned something that cannot be stored as JSON."""


# How a Django Tasks ``Task`` runs one attempt for a job: installed by the Tasks room when
# it is wired in (tasks.ready(), from AppConfig.ready()), so the worker never imports
# that room. Only the framework makes Tasks, so a Task found in the registry means the
# framework is installed and ready() has run.
_task_runner: Callable[[Any, Job], Any] | None = None


def set_task_runner(runner: Callable[[Any, Job], Any]) -> None:
    global _task_runner
    _task_runner = runner


# Results of these types are JSON as they are; anything else is checked by a round trip.
_PLAIN = (type(None), bool, int, str)


def call_job(job: Job) -> Any:
    """Import the job's task and call it with its arguments; return a JSON-ready result.

    A Django Tasks ``Task`` (an ``@task`` function) runs through the framework: its
    function gets a ``TaskContext`` when it takes one, and ``task_started`` is sent.
    With tracing on, or a wrapper registered, it runs inside them (observability/hooks.py).
    """
    wrapped = hooks.around(job)
    token = CURRENT_JOB.set(job.id)  # what dependency_results() reads (workflows/results.py)
    try:
        if wrapped is None:
            return _call(job)
        with wrapped:
            return _call(job)
    finally:
        CURRENT_JOB.reset(token)


def runs_async(job: Job) -> bool:
    """Is the job's task an ``async def`` ``@job`` (for the asyncio executor's loop)?
    An unregistered path is not: the plain call fails it."""
    entry = registry.registered(job.task)
    return entry is not None and entry.is_async


async def acall_job(job: Job) -> Any:
    """Await the job's ``async def`` task with its arguments; return a JSON-ready result.

    The event loop's side of :func:`call_job`: the same registry, wrappers and result
    checks."""
    entry = registry.find(job.task)
    wrapped = hooks.around(job)
    if wrapped is None:
        result = await entry.func(*(job.args or []), **(job.kwargs or {}))
    else:
        with wrapped:
            result = await entry.func(*(job.args or []), **(job.kwargs or {}))
    return _stored(job, result)


def _call(job: Job) -> Any:
    # Nothing is imported for the path: a row names its task, and whoever wrote the row
    # must not choose what code is imported. A path the registry does not know raises
    # UnregisteredTask, which no retry can cure: the worker fails the job at once.
    entry = registry.find(job.task)
    if entry.is_framework_task:
        if _task_runner is None:
            raise RuntimeError("Django Tasks is not wired in: AppConfig.ready() has not run")
        result = _task_runner(entry.func, job)
    elif entry.is_async:
        # No event loop of the executor's here: this job gets one of its own.
        result = asyncio.run(entry.func(*(job.args or []), **(job.kwargs or {})))
    else:
        result = entry.func(*(job.args or []), **(job.kwargs or {}))
    return _stored(job, result)


def _stored(job: Job, result: Any) -> Any:
    if type(result) in _PLAIN and (
        type(result) is not str or (len(result) <= 1024 and "\x00" not in result)
    ):
        return result
    return storable(job.task, result)


def storable(task: str, result: Any) -> Any:
    """The result as it will be stored, or ResultNotSerializable when no database could
    store it: the same bounds as a job's arguments (JSON, nesting, NUL, size), so a
    hostile return value fails its own attempt instead of the worker's bookkeeping."""
    try:
        text = json.dumps(result, allow_nan=False)
    except RecursionError:
        raise _unstorable(task, result, f"nested deeper than {bounds.MAX_NESTING} levels") from None
    except (TypeError, ValueError) as exc:
        raise _unstorable(task, result, f"not JSON-serializable ({exc})") from None
    if text.count("[") + text.count("{") > bounds.MAX_NESTING:
        try:
            bounds.check_nesting([result], "result")
        except InvalidJob:
            raise _unstorable(
                task, result, f"nested deeper than {bounds.MAX_NESTING} levels"
            ) from None
    if bounds.has_nul(text):
        raise _unstorable(task, result, "holding a NUL character (\\x00)")
    limit = int(settings.MAX_PAYLOAD_BYTES)
    if len(text) > limit:
        raise _unstorable(task, result, f"{len(text)} bytes of JSON, over MAX_PAYLOAD_BYTES")
    return json.loads(text)


def _unstorable(task: str, result: Any, why: str) -> ResultNotSerializable:
    return ResultNotSerializable(
        f"{task} returned {type(result).__name__} {why}, which cannot be stored; return "
        "plain data (or None) from jobs."
    )


@contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise :class:`JobTimeout` inside the block once ``seconds`` have passed.

    Uses SIGALRM, so it interrupts Python code and blocking system calls of the main
    thread. Code stuck inside a C extension does not see the signal and runs on.
    """
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        raise JobTimeout(f"Job exceeded its timeout of {seconds:g} s and was stopped.")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
