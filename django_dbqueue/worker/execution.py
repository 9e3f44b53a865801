"""Running one job's callable: import it, call it, enforce its timeout."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from django_dbqueue.exceptions import JobTimeout
from django_dbqueue.models import Job
from django_dbqueue.registry import resolve


class ResultNotSerializable(TypeError):
    """The job returned something that cannot be stored as JSON."""


# Where the Django Tasks framework defines Task: Django 6, and the backport for Django 5.2.
TASK_CLASSES = {("django.tasks.base", "Task"), ("django_tasks.base", "Task")}


def is_framework_task(obj: object) -> bool:
    """Is ``obj`` a Django Tasks ``Task`` (what ``@task`` makes)?

    Checked by class name so that plain jobs never import the framework.
    """
    return any((cls.__module__, cls.__qualname__) in TASK_CLASSES for cls in type(obj).__mro__)


# Workers never reload code, so a path imports to the same callable for the life of the
# process: look each one up once. Failures are not cached (the error is the answer).
_resolved: dict[str, tuple[Callable[..., Any], bool]] = {}
_RESOLVED_MAX = 10_000


def lookup(path: str) -> tuple[Callable[..., Any], bool]:
    """(callable, is a Django Tasks task) for a task path; raises TaskNotFound."""
    try:
        return _resolved[path]
    except KeyError:
        func = resolve(path)
        entry = (func, is_framework_task(func))
        if len(_resolved) < _RESOLVED_MAX:
            _resolved[path] = entry
        return entry


# Results of these types are JSON as they are; anything else is checked by a round trip.
_PLAIN = (type(None), bool, int, str)


def call_job(job: Job) -> Any:
    """Import the job's task and call it with its arguments; return a JSON-ready result.

    A Django Tasks ``Task`` (an ``@task`` function) runs through the framework: its
    function gets a ``TaskContext`` when it takes one, and ``task_started`` is sent.
    """
    func, is_task = lookup(job.task)
    if is_task:
        from django_dbqueue.tasks.results import run_task

        result = run_task(func, job)
    else:
        result = func(*(job.args or []), **(job.kwargs or {}))
    if type(result) in _PLAIN:
        return result
    try:
        return json.loads(json.dumps(result, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ResultNotSerializable(
            f"{job.task} returned {type(result).__name__}, which is not JSON-serializable "
            f"({exc}); return plain data (or None) from jobs."
        ) from None


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
