"""What the worker tells observability beyond the signals: each job's call, wrapped in
the tracing span and timed by the metrics' :data:`meter`, and the outcomes no signal
reports.

``worker/execution.call_job`` asks :func:`around` for each job and tells the
:data:`meter` (no context manager: 1.7 µs a job was most of what metrics cost a
no-op job); with neither tracing (a tracer provider set) nor metrics on, that is all it
costs. The worker calls
:func:`recorded` where it records a cancel (before the job started, while it ran, or
by killing the process of a job that ignored it). The metrics register here
(:mod:`.metrics`, in the supervisor before it forks, so every child inherits them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import TYPE_CHECKING, Any, Protocol

from django_dbqueue.observability import tracing

if TYPE_CHECKING:
    from django_dbqueue.models import Job

Wrapper = Callable[["Job"], AbstractContextManager[Any]]
Listener = Callable[["Job", str], None]


class Meter(Protocol):
    """The metrics' side of each job, told without wrapping its call (a wrapper costs a
    context manager a job): :meth:`began` before the call, :meth:`ended` after it,
    whatever it raised, and :meth:`done` for the jobs a batched write recorded DONE (one
    call a batch, where a ``job_finished`` receiver costs a call a job)."""

    def began(self, job: Job) -> float: ...

    def ended(self, job: Job, began: float, deferred: bool) -> None: ...

    def done(self, jobs: Sequence[Job]) -> None: ...


_wrappers: list[Wrapper] = []
_listeners: list[Listener] = []
# The metrics' meter (observability/metrics.py), or None: read by call_job for each job.
meter: Meter | None = None


def set_meter(new: Meter | None) -> None:
    global meter
    meter = new


def done(jobs: Sequence[Job]) -> None:
    """The worker (or the supervisor, for a dead child's log) recorded ``jobs`` DONE."""
    if meter is not None and jobs:
        meter.done(jobs)


def add(wrapper: Wrapper) -> None:
    _join(_wrappers, wrapper)


def remove(wrapper: Wrapper) -> None:
    _leave(_wrappers, wrapper)


def listen(listener: Listener) -> None:
    _join(_listeners, listener)


def unlisten(listener: Listener) -> None:
    _leave(_listeners, listener)


def _join(members: list[Any], member: Any) -> None:
    if member not in members:
        members.append(member)


def _leave(members: list[Any], member: Any) -> None:
    if member in members:
        members.remove(member)


def recorded(job: Job, outcome: str) -> None:
    """The worker recorded ``outcome`` ("cancelled") for ``job``: no signal reports it."""
    for listener in _listeners:
        listener(job, outcome)


def around(job: Job) -> AbstractContextManager[Any] | None:
    """What to run the job's call in, or None when nothing wraps it."""
    traced = tracing.recording() is not None
    if not traced:
        if not _wrappers:
            return None
        if len(_wrappers) == 1:
            return _wrappers[0](job)
    return _stacked(job, traced)


@contextmanager
def _stacked(job: Job, traced: bool) -> Iterator[None]:
    """The job's span (outermost), then every registered wrapper."""
    with ExitStack() as stack:
        if traced:
            stack.enter_context(tracing.job_span(job))
        for wrapper in list(_wrappers):
            stack.enter_context(wrapper(job))
        yield
