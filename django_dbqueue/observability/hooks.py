"""What wraps each job's call in the worker: the tracing span and the metrics' timers.

``worker/execution.call_job`` asks :func:`active` before each job; with neither tracing
(a tracer provider set) nor metrics on, that is all it costs. The metrics register their
wrapper here (:mod:`.metrics`, in the supervisor before it forks, so every child
inherits it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import TYPE_CHECKING, Any

from django_dbqueue.observability import tracing

if TYPE_CHECKING:
    from django_dbqueue.models import Job

Wrapper = Callable[["Job"], AbstractContextManager[Any]]

_wrappers: list[Wrapper] = []


def add(wrapper: Wrapper) -> None:
    if wrapper not in _wrappers:
        _wrappers.append(wrapper)


def remove(wrapper: Wrapper) -> None:
    if wrapper in _wrappers:
        _wrappers.remove(wrapper)


def active() -> bool:
    """Does anything wrap a job's call (a tracer, the metrics)?"""
    return bool(_wrappers) or tracing.recording() is not None


@contextmanager
def around(job: Job) -> Iterator[None]:
    """Run the block inside the job's span (outermost) and every registered wrapper."""
    with ExitStack() as stack:
        if tracing.recording() is not None:
            stack.enter_context(tracing.job_span(job))
        for wrapper in list(_wrappers):
            stack.enter_context(wrapper(job))
        yield
